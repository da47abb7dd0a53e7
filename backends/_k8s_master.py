"""The Kubernetes backend's capabilities for the ``fiberexec`` command: run a master, probe.

`master_pod` is pure; `launch_master` creates the master's Pod, streams its logs and returns
its container's exit code; `probe` looks for an in-cluster service account or a kubeconfig
context without contacting the API server. Kubernetes client errors during `launch_master`
are translated by `api_errors`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from fiberexec.backend import (
    LABEL_KEY,
    MASTER_LABEL,
    ConfigurationError,
    MasterRequest,
    Probe,
    first_line,
)
from fiberexec.backends._k8s_config import default_namespace, in_cluster, make_api_client
from fiberexec.backends._k8s_errors import api_errors

LOG_WAIT = 120  # seconds to wait for the exit code once the log stream has ended


def master_pod(request: MasterRequest, environ: Mapping[str, str], name: str) -> dict[str, Any]:
    """The master's Pod manifest.

    It runs under the executor's service account (``docs/kubernetes-rbac.yaml``) and learns
    its own address through the downward API (``POD_IP``), which the Kubernetes backend
    advertises to the workers; worker pods are owned by this pod (``HOSTNAME``).
    """
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(request.master_env(environ).items())
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
                "image": request.require_image(),
                "command": list(request.command),
                "env": env,
            }],
        },
    }


def launch_master(request: MasterRequest) -> int:
    """Run the program in a Pod; stream its logs; return its exit status."""
    request.require_image()
    if importlib.util.find_spec("kubernetes") is None:
        raise ConfigurationError("fiberexec run --backend kubernetes needs the kubernetes "
                                 "client: pip install 'fiberexec[kubernetes]'")
    client, watch = (importlib.import_module(f"kubernetes.{m}") for m in ("client", "watch"))
    api_client = make_api_client(None, None)
    core = client.CoreV1Api(api_client)
    namespace = request.namespace or default_namespace(None, None)
    name = f"fiberexec-master-{secrets.token_hex(3)}"
    with api_errors("create", "pods", namespace):
        core.create_namespaced_pod(namespace, master_pod(request, os.environ, name))
    print(f"fiberexec: started pod {namespace}/{name}", file=sys.stderr)
    try:
        with api_errors("watch", "pods", namespace):
            return _follow(core, watch, namespace, name, request.start_timeout)
    except KeyboardInterrupt:
        return 130
    finally:
        if not request.keep:
            with api_errors("delete", "pods", namespace):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=5)
        api_client.close()


def _follow(core: Any, watch: Any, namespace: str, name: str, start_timeout: float) -> int:
    phase = _wait_started(core, watch.Watch(), namespace, name, start_timeout)
    if phase == "Pending":
        print(f"fiberexec: pod {name} still Pending after {start_timeout:.0f}s; "
              f"see kubectl describe pod -n {namespace} {name}", file=sys.stderr)
        return 1
    _stream_logs(core, namespace, name)
    return _pod_exit_code(core, watch.Watch(), namespace, name)


def _watch_phases(core: Any, w: Any, namespace: str, name: str,
                  timeout: float) -> Iterator[tuple[str, Any]]:
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
    for phase, pod in _watch_phases(core, w, namespace, name, LOG_WAIT):
        if phase in ("Succeeded", "Failed"):
            w.stop()
            for status in pod.status.container_statuses or []:
                if status.state.terminated is not None:
                    return int(status.state.terminated.exit_code)
            return 0 if phase == "Succeeded" else 1
    return 1


def probe() -> Probe:
    """The client importable and an in-cluster config or a kubeconfig context present."""
    if importlib.util.find_spec("kubernetes") is None:
        return Probe("kubernetes", False, "the kubernetes client is missing: "
                                          "pip install 'fiberexec[kubernetes]'")
    if in_cluster():
        return Probe("kubernetes", True, "in-cluster service account")
    config: Any = importlib.import_module("kubernetes.config")
    try:
        _, active = config.list_kube_config_contexts()
    except (config.ConfigException, OSError) as exc:
        return Probe("kubernetes", False, f"no kubeconfig context: {first_line(exc)}")
    name = (active or {}).get("name", "?")
    namespace = ((active or {}).get("context") or {}).get("namespace", "default")
    return Probe("kubernetes", True, f"context {name!r}, namespace {namespace!r} "
                                     "(the API server was not contacted)")

