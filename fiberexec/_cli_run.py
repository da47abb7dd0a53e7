"""``fiberexec run``: launch a program as the master job, as a process, container or pod.

The program's own `FiberExecutor` then starts workers on the same backend: the launcher sets
``FIBEREXEC_BACKEND`` (and ``FIBEREXEC_IMAGE``) and passes every other ``FIBEREXEC_*``
variable on. The builders (`master_env`, `docker_run_kwargs`, `master_pod`) are pure
functions; the launchers do the I/O through the SDKs, imported on first use.
"""

from __future__ import annotations

import importlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiberexec._backend import LABEL_KEY
from fiberexec._config import ENV_PREFIX
from fiberexec._errors import ConfigurationError

DOCKER_SOCKET = "/var/run/docker.sock"
DEFAULT_SERVICE_ACCOUNT = "fiberexec-executor"  # docs/kubernetes-rbac.yaml
MASTER_LABEL = "fiberexec.master"


@dataclass(frozen=True)
class RunRequest:
    """What ``fiberexec run`` was asked to do."""

    command: tuple[str, ...]
    backend: str
    image: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # --env KEY=VALUE
    namespace: str | None = None
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    start_timeout: float = 300.0
    keep: bool = False


def master_env(request: RunRequest, environ: Mapping[str, str]) -> dict[str, str]:
    """The ``FIBEREXEC_*`` variables of this shell, the backend and image, then ``--env``."""
    env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    env[f"{ENV_PREFIX}BACKEND"] = request.backend
    if request.image:
        env[f"{ENV_PREFIX}IMAGE"] = request.image
    env.update(request.env)
    return env


def exit_status(code: int) -> int:
    """A shell's exit status for a child's return code (signal N -> 128 + N)."""
    return 128 - code if code < 0 else code


# ------------------------------------------------------------------ local


def run_local(request: RunRequest) -> int:
    """Run the program as a child process with the master's environment; return its status."""
    env = {**os.environ, **master_env(request, os.environ)}
    try:
        proc = subprocess.Popen(request.command, env=env)
    except FileNotFoundError:
        raise ConfigurationError(f"cannot run {request.command[0]!r}: no such program") from None
    try:
        return exit_status(proc.wait())
    except KeyboardInterrupt:  # the child got the terminal's SIGINT too: let it finish up
        proc.send_signal(signal.SIGINT)
        return exit_status(proc.wait())


# ------------------------------------------------------------------ docker


def _require_image(request: RunRequest) -> str:
    if not request.image:
        raise ConfigurationError(
            f"the {request.backend} backend needs an image with fiberexec and your code's "
            "dependencies; pass --image, set FIBEREXEC_IMAGE, or set image in the config file"
        )
    return request.image


def docker_run_kwargs(
    request: RunRequest, cwd: str, environ: Mapping[str, str], *, local_engine: bool
) -> dict[str, Any]:
    """``containers.create`` arguments for the master container.

    Host networking (workers dial the master), the host's IPC namespace (shared memory with
    the workers), the working directory mounted at the same path (workers mount it the same
    way), and the engine's socket when it is local, so the master can start worker containers.
    """
    volumes = {cwd: {"bind": cwd, "mode": "rw"}}
    if local_engine:
        volumes[DOCKER_SOCKET] = {"bind": DOCKER_SOCKET, "mode": "rw"}
    return {
        "image": _require_image(request),
        "command": list(request.command),
        "environment": master_env(request, environ),
        "working_dir": cwd,
        "volumes": volumes,
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,
        "labels": {LABEL_KEY: "master", MASTER_LABEL: "docker"},
        "detach": True,
    }


def run_docker(request: RunRequest) -> int:
    """Run the program in a container; stream its output; return its exit status."""
    try:
        import docker
    except ImportError:
        raise ConfigurationError(
            "fiberexec run --backend docker needs the docker SDK: "
            "pip install 'fiberexec[docker]'") from None
    client = docker.from_env(timeout=60)
    local_engine = str(client.api.base_url).startswith(("http+docker://localhost", "unix:"))
    kwargs = docker_run_kwargs(request, os.getcwd(), os.environ, local_engine=local_engine)
    container = client.containers.create(**kwargs)
    try:
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        return int(container.wait(timeout=60).get("StatusCode", 1))
    except KeyboardInterrupt:
        container.stop(timeout=10)
        return 130
    finally:
        if not request.keep:
            container.remove(force=True)
        client.close()


# ------------------------------------------------------------------ kubernetes


def master_pod(request: RunRequest, environ: Mapping[str, str], name: str) -> dict[str, Any]:
    """The master's Pod manifest.

    It runs under the executor's service account (``docs/kubernetes-rbac.yaml``) and learns
    its own address through the downward API (``POD_IP``), which the Kubernetes backend
    advertises to the workers; worker pods are owned by this pod (``HOSTNAME``).
    """
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(master_env(request, environ).items())
    ]
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    labels = {LABEL_KEY: "master", MASTER_LABEL: name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": request.service_account,
            "containers": [{
                "name": "master",
                "image": _require_image(request),
                "command": list(request.command),
                "env": env,
            }],
        },
    }


def run_kubernetes(request: RunRequest) -> int:
    """Run the program in a Pod; stream its logs; return its exit status."""
    try:
        client, config, watch = (importlib.import_module(f"kubernetes.{m}")
                                 for m in ("client", "config", "watch"))
    except ImportError:
        raise ConfigurationError(
            "fiberexec run --backend kubernetes needs the kubernetes client: "
            "pip install 'fiberexec[kubernetes]'") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    core = client.CoreV1Api()
    namespace = request.namespace or _kube_namespace(config)
    name = f"fiberexec-master-{secrets.token_hex(3)}"
    core.create_namespaced_pod(namespace, master_pod(request, os.environ, name))
    print(f"fiberexec: started pod {namespace}/{name}", file=sys.stderr)
    try:
        phase = _wait_started(core, watch.Watch(), namespace, name, request.start_timeout)
        if phase == "Pending":
            print(f"fiberexec: pod {name} still Pending after {request.start_timeout:.0f}s; "
                  f"see kubectl describe pod -n {namespace} {name}", file=sys.stderr)
            return 1
        _stream_logs(core, namespace, name)
        return _pod_exit_code(core, watch.Watch(), namespace, name)
    except KeyboardInterrupt:
        return 130
    finally:
        if not request.keep:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=5)


def _kube_namespace(config: Any) -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if path.exists():
        return path.read_text().strip() or "default"
    _, active = config.list_kube_config_contexts()
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def _watch_phases(core: Any, w: Any, namespace: str, name: str, timeout: float) -> Any:
    for event in w.stream(core.list_namespaced_pod, namespace,
                          field_selector=f"metadata.name={name}",
                          timeout_seconds=max(1, int(timeout))):
        yield event["object"].status.phase, event["object"]


def _wait_started(core: Any, w: Any, namespace: str, name: str, timeout: float) -> str:
    for phase, _ in _watch_phases(core, w, namespace, name, timeout):
        if phase != "Pending":
            w.stop()
            return str(phase)
    return "Pending"


def _stream_logs(core: Any, namespace: str, name: str) -> None:
    resp = core.read_namespaced_pod_log(name, namespace, follow=True, _preload_content=False)
    try:
        for chunk in resp.stream(4096):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    finally:
        resp.release_conn()


def _pod_exit_code(core: Any, w: Any, namespace: str, name: str) -> int:
    for phase, pod in _watch_phases(core, w, namespace, name, 120):
        if phase in ("Succeeded", "Failed"):
            w.stop()
            for status in pod.status.container_statuses or []:
                if status.state.terminated is not None:
                    return int(status.state.terminated.exit_code)
            return 0 if phase == "Succeeded" else 1
    return 1


# ------------------------------------------------------------------ slurm


def run_slurm(request: RunRequest) -> int:
    """Submit the program as a batch job; the Slurm backend module does the work."""
    slurm: Any = importlib.import_module("fiberexec.backends.slurm")
    return int(slurm.run_master(request.command, master_env(request, os.environ),
                                keep=request.keep))


LAUNCHERS = {"local": run_local, "docker": run_docker, "kubernetes": run_kubernetes,
             "slurm": run_slurm}
NO_IMAGE = ("local", "slurm")  # backends whose jobs run on the host's own filesystem


def run(request: RunRequest) -> int:
    if not request.command:
        raise ConfigurationError("fiberexec run needs a program: fiberexec run -- python train.py")
    launcher = LAUNCHERS.get(request.backend)
    if launcher is None:
        raise ConfigurationError(
            f"--backend must be one of {sorted(LAUNCHERS)} for fiberexec run, "
            f"got {request.backend!r}")
    if request.backend not in NO_IMAGE:
        _require_image(request)
    return launcher(request)


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--env must be KEY=VALUE, got {pair!r}")
        env[key] = value
    return env
