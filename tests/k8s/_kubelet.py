"""The emulator's one node: schedules each pod, "pulls" its image, runs its first container.

A container is a local process (the "image" is this host's Python environment: ``python``
means ``sys.executable``) in its own session, with only the pod's environment (plus PATH and
PYTHONPATH), stdout+stderr kept for pods/log. Pod status moves as a kubelet would report it:
Pending (unschedulable / waiting: ErrImagePull, ImagePullBackOff, CreateContainerConfigError)
-> Running -> Succeeded / Failed with the exit code (128+signal when killed) and reason.
Simulated, not measured: OOMKilled and Evicted are faults the test asks for.

A failed image pull follows the kubelet's sequence: ``ErrImagePull`` with the runtime's error
(containerd's words, through the CRI), then ``ImagePullBackOff`` while it waits, then
``ErrImagePull`` again at the next attempt, the wait doubling each time up to a cap, until the
pod is deleted. Waits are the kubelet's (10 s doubling to 300 s) scaled by ``PULL_TIME_SCALE``.
``ImagePullBackOff`` says only ``Back-off pulling image "<image>"``, as kubelets before 1.32
do, or (``backoff_detail``) repeats the pull error after ``: ErrImagePull: ``, as 1.32 does.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.k8s._store import Json, Store, now_iso

NODE = "emulator-node"
_KEEP_ENV = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG", "LC_ALL", "TMPDIR", "PYENV_VERSION")
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
PULL_TIME_SCALE = 0.02  # the kubelet's 10 s first back-off becomes 0.2 s
_PULL_BACKOFF, _PULL_BACKOFF_MAX = 10.0, 300.0  # kubelet's image back-off, seconds
_PULL_ATTEMPTS = 200  # bounded: ~2 min of attempts at the scaled cap, ends early on delete


def _qualified(image: str) -> str:
    """containerd's normalised reference: ``nope:1`` -> ``docker.io/library/nope:1``."""
    name, tag = image.rsplit(":", 1) if ":" in image.rsplit("/", 1)[-1] else (image, "latest")
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return f"{name}:{tag}"


def pull_error_message(kind: str, image: str) -> str:
    """What containerd answers the kubelet for a failed pull of ``image``, by ``kind``."""
    ref = _qualified(image)
    registry = ref.split("/", 1)[0]
    head = f'failed to pull and unpack image "{ref}": failed to resolve reference "{ref}": '
    messages = {
        # the tag does not exist in a repository that does
        "not-found": f"rpc error: code = NotFound desc = {head}{ref}: not found",
        # the repository does not exist (Docker Hub cannot tell it from a private one)
        "no-repository": f"rpc error: code = Unknown desc = {head}pull access denied, "
                         "repository does not exist or may require authorization: server "
                         "message: insufficient_scope: authorization failed",
        # a private registry without (valid) imagePullSecrets
        "unauthorized": f"rpc error: code = Unknown desc = {head}failed to authorize: failed "
                        "to fetch oauth token: unexpected status from POST request to "
                        f"https://{registry}/oauth2/token: 401 Unauthorized",
        # the registry is slow or unreachable: worth retrying
        "timeout": f"rpc error: code = Unknown desc = {head}failed to do request: Head "
                   f'"https://{registry}/v2/{ref.split("/", 1)[1].rsplit(":", 1)[0]}/manifests/'
                   f'{ref.rsplit(":", 1)[1]}": dial tcp 127.0.0.1:443: i/o timeout',
        "rate-limit": f"rpc error: code = Unknown desc = {head}unexpected status from HEAD "
                      f"request to https://registry-1.{registry}/v2/: 429 Too Many Requests - "
                      "Server message: toomanyrequests: You have reached your pull rate limit. "
                      "You may increase the limit by authenticating and upgrading: "
                      "https://www.docker.com/increase-rate-limit",
    }
    if kind not in messages:
        raise ValueError(f"pull error kind must be one of {sorted(messages)}, got {kind!r}")
    return messages[kind]


@dataclass(frozen=True)
class PullFailure:
    """How pulling one image fails: the runtime's error, and the kubelet's back-off style."""

    kind: str = "not-found"
    backoff_detail: bool = False  # kubelet >= 1.32 repeats the error in ImagePullBackOff


def quantity(text: str) -> float:
    match = _QUANTITY.match(str(text))
    if match is None:
        raise ValueError(f"quantities must match the regular expression "
                         f"'{_QUANTITY.pattern}', got {text!r}")
    return float(match.group(1)) * _SCALE[match.group(2)]


@dataclass
class Faults:
    """Node-side faults; the emulator's API sets them."""

    schedule_delay: float = 0.0
    status_lag: float = 0.0  # a started container reported Running this much later (PLEG)
    unschedulable: str | None = None
    pull_errors: dict[str, PullFailure] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=lambda: {
        "cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "0"})


@dataclass
class _Run:
    """One pod's life on the node. A pod deleted and created again under the same name is
    another pod (another uid): its run never touches the new one's status or container."""

    namespace: str
    name: str
    uid: str
    gone: threading.Event = field(default_factory=threading.Event)  # deleted before exit
    # Held while the process is started and while a delete decides how to end it: a delete
    # either finds the process, or the start finds the pod deleted (never neither).
    lock: threading.Lock = field(default_factory=threading.Lock)
    exited: threading.Event = field(default_factory=threading.Event)
    proc: subprocess.Popen[bytes] | None = None
    override: str | None = None  # terminated reason forced by a fault (OOMKilled, Evicted)
    remove_on_exit: bool = False


RUNTIMES = ("process", "docker")


class Kubelet:
    """Runs admitted pods: as local processes, or as Docker containers on the host network.

    ``runtime="docker"`` needs a reachable engine: pods then run their real image (a missing
    image is a real ErrImagePull), with host networking and IPC, the working directory mounted.
    """

    def __init__(self, store: Store, faults: Faults, logdir: Path,
                 runtime: str = "process") -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
        self.store, self.faults, self.logdir, self.runtime = store, faults, logdir, runtime
        self._runs: dict[str, _Run] = {}  # by pod uid
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    # -- API-side entry points -------------------------------------------------------------
    def admit(self, pod: Json) -> None:
        meta = pod["metadata"]
        run = _Run(meta["namespace"], meta["name"], meta["uid"])
        thread = threading.Thread(target=self._lifecycle, args=(run,), daemon=True,
                                  name=f"kubelet-{run.name}")
        with self._lock:
            self._runs[run.uid] = run
            self._threads.append(thread)
        thread.start()

    def log_path(self, pod: Json) -> Path:
        """Where the container of ``pod`` (this very pod, by uid) writes its output."""
        meta = pod["metadata"]
        return self.logdir / _log_name(meta["namespace"], meta["name"], meta["uid"])

    def _current(self, namespace: str, name: str) -> _Run | None:
        """The run of the pod stored under ``name`` now (not of an earlier pod so named)."""
        pod = self.store.get("pods", namespace, name)
        with self._lock:
            return self._runs.get(pod["metadata"]["uid"]) if pod is not None else None

    def delete(self, namespace: str, name: str, grace: float) -> Json | None:
        """Delete a pod as the API server + kubelet do; returns the pod as deleted/terminating."""
        run = self._current(namespace, name)
        proc, force = None, True
        if run is not None:
            with run.lock:
                proc = run.proc
                force = proc is None or run.exited.is_set() or grace <= 0
                if force:
                    run.gone.set()
        if force:
            deleted = self.store.delete("pods", namespace, name,
                                        uid=run.uid if run is not None else None)
            if run is not None and proc is not None and not run.exited.is_set():
                self._signal(run, signal.SIGKILL)
                run.exited.wait(10)  # the process is gone when the call returns
            return deleted
        assert run is not None and proc is not None  # (else the delete is forced, above)
        run.remove_on_exit = True
        pod = self.store.update("pods", namespace, name, lambda p: p["metadata"].update(
            deletionTimestamp=now_iso(), deletionGracePeriodSeconds=int(grace)), uid=run.uid)
        threading.Thread(target=self._terminate, args=(run, proc, grace), daemon=True).start()
        return pod

    def kill(self, namespace: str, name: str, sig: int, override: str | None = None) -> None:
        run = self._current(namespace, name)
        if run is None or run.proc is None:
            raise RuntimeError(f"pod {namespace}/{name} has no running process")
        run.override = override
        self._signal(run, sig)

    def settle(self, timeout: float) -> None:
        """Wait (on each pod's exit event) for pods still terminating, ``timeout`` at most.

        Deleting a pod is asynchronous, as in Kubernetes: its grace period runs after the
        API call returns.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            runs = [r for r in self._runs.values() if r.proc is not None]
        for run in runs:
            run.exited.wait(max(0.0, deadline - time.monotonic()))

    def running(self) -> list[str]:
        with self._lock:
            runs = list(self._runs.values())
        return [f"process {r.proc.pid} of pod {r.namespace}/{r.name}" for r in runs
                if r.proc is not None and r.proc.poll() is None]

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            runs, threads = list(self._runs.values()), list(self._threads)
        for run in runs:
            with run.lock:  # a process starting now sees the pod gone (see `_start`)
                run.gone.set()
            if run.proc is not None and run.proc.poll() is None:
                self._signal(run, signal.SIGKILL)
        for thread in threads:
            thread.join(timeout)

    # -- the pod's life --------------------------------------------------------------------
    def _lifecycle(self, run: _Run) -> None:
        pod = self.store.get("pods", run.namespace, run.name)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return  # deleted (and perhaps created again) before it was scheduled
        if not self._schedule(run, pod) or not self._pull(run, pod):
            return
        env = self._environment(run, pod)
        if env is None:
            return
        container = pod["spec"]["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        if command[:1] == ["python"] and self.runtime == "process":
            command[0] = sys.executable
        self._start(run, container, command, env)

    def _schedule(self, run: _Run, pod: Json) -> bool:
        if self.faults.schedule_delay and run.gone.wait(self.faults.schedule_delay):
            return False
        why = self.faults.unschedulable or self._no_fit(pod)
        if why is not None:
            self._set_status(run, {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": why, "lastTransitionTime": now_iso()}]})
            return False  # stays Pending until deleted, as on a full cluster
        self.store.update("pods", run.namespace, run.name, lambda p: p["spec"].update(
            nodeName=NODE), uid=run.uid)
        self._set_status(run, {
            "conditions": [{"type": "PodScheduled", "status": "True",
                            "lastTransitionTime": now_iso()}],
            "hostIP": "127.0.0.1",
            "containerStatuses": [_container_status(pod, {"waiting": {
                "reason": "ContainerCreating"}})]})
        return True

    def _no_fit(self, pod: Json) -> str | None:
        requests: dict[str, float] = {}
        for container in pod["spec"]["containers"]:
            resources = container.get("resources") or {}
            for key, value in {**resources.get("limits", {}),
                               **resources.get("requests", {})}.items():
                requests[key] = requests.get(key, 0.0) + quantity(value)
        short = [key for key, amount in sorted(requests.items())
                 if amount > quantity(self.faults.allocatable.get(key, "0"))]
        if not short:
            return None
        return ("0/1 nodes are available: " + ", ".join(f"1 Insufficient {k}" for k in short)
                + ". preemption: 0/1 nodes are available: 1 No preemption victims found.")

    def _pull(self, run: _Run, pod: Json) -> bool:
        image = pod["spec"]["containers"][0].get("image", "")
        failure = self.faults.pull_errors.get(image)
        if failure is not None:
            message = pull_error_message(failure.kind, image)
        elif self.runtime == "docker" and not _image_present(image):
            failure = PullFailure()
            message = (f"Error response from daemon: pull access denied for {image}, repository "
                       "does not exist or may require 'docker login': denied: requested access "
                       "to the resource is denied")
        else:
            return True
        backoff = f'Back-off pulling image "{image}"'
        if failure.backoff_detail:
            backoff += f": ErrImagePull: {message}"
        delay = _PULL_BACKOFF
        for _ in range(_PULL_ATTEMPTS):
            self._waiting(run, pod, "ErrImagePull", message)
            if run.gone.wait(0.05):  # the pod worker's next sync finds the image backing off
                return False
            self._waiting(run, pod, "ImagePullBackOff", backoff)
            if run.gone.wait(delay * PULL_TIME_SCALE):
                return False
            delay = min(delay * 2, _PULL_BACKOFF_MAX)
        return False  # stays Pending until deleted

    def _environment(self, run: _Run, pod: Json) -> dict[str, str] | None:
        """The container's env, retried while a referenced Secret is missing (as kubelet)."""
        for _ in range(600):  # bounded: ~2.5 min of 0.25 s retries, ends early on delete
            env, missing = self._resolve_env(run, pod)
            if missing is None:
                return env
            self._waiting(run, pod, "CreateContainerConfigError", missing)
            if run.gone.wait(0.25):
                return None
        return None

    def _resolve_env(self, run: _Run, pod: Json) -> tuple[dict[str, str], str | None]:
        container = pod["spec"]["containers"][0]
        env = {k: os.environ[k] for k in _KEEP_ENV if k in os.environ}
        env["HOSTNAME"] = run.name
        for source in container.get("envFrom") or []:
            data = self._secret(run.namespace, source.get("secretRef", {}).get("name", ""))
            if data is None:
                return env, f'secret "{source["secretRef"]["name"]}" not found'
            env.update(data)
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                env[item["name"]] = item.get("value", "")
                continue
            data = self._secret(run.namespace, ref["name"])
            if data is None or ref["key"] not in data:
                return env, f'secret "{ref["name"]}" not found' if data is None else (
                    f"couldn't find key {ref['key']} in Secret {run.namespace}/{ref['name']}")
            env[item["name"]] = data[ref["key"]]
        return env, None

    def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        secret = self.store.get("secrets", namespace, name)
        if secret is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _start(self, run: _Run, container: Json, command: list[str],
               env: dict[str, str]) -> None:
        log = (self.logdir / _log_name(run.namespace, run.name, run.uid)).open("wb")
        try:
            with log:
                argv, proc_env = command, env
                if self.runtime == "docker":
                    argv, proc_env = self._docker_run(run, container, command, env)
                with run.lock:
                    run.proc = subprocess.Popen(
                        argv, env=proc_env, cwd=container.get("workingDir") or self.logdir,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True, close_fds=True)
                    deleted = run.gone.is_set()
        except (OSError, subprocess.SubprocessError) as exc:
            run.exited.set()
            self._terminated(run, 128, "StartError", f"exec: {exc}")
            return
        if deleted:  # deleted while starting: the delete found no process to end
            self._signal(run, signal.SIGKILL)
        if self.faults.status_lag:  # the kubelet reports a start at its next status sync
            run.exited.wait(self.faults.status_lag)
        self._set_status(run, {"phase": "Running", "podIP": "127.0.0.1",
                               "startTime": now_iso(),
                               "containerStatuses": [_container_status(
                                   self.store.get("pods", run.namespace, run.name) or {},
                                   {"running": {"startedAt": now_iso()}}, ready=True)]})
        code = run.proc.wait()  # blocks until the process ends
        run.exited.set()
        code = code if code >= 0 else 128 - code  # a runtime reports 128+signal
        reason = ("Completed" if code == 0 else "Error") if run.override in (
            None, "Evicted") else run.override
        self._terminated(run, code, reason, None)

    def _docker_run(self, run: _Run, container: Json, command: list[str],
                    env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """Create the pod's container now (so a delete can always find it), and return the
        command that starts and attaches to it. Values travel in the CLI's environment
        (``-e KEY``), so no secret appears on a command line."""
        workdir = container.get("workingDir") or str(self.logdir)
        tmp = tempfile.gettempdir()
        argv = ["docker", "create", "--rm", "--name", _container_name(run),
                "--network", "host", "--ipc", "host", "--init",
                "--label", "fiberexec-emulator=1", "-v", f"{workdir}:{workdir}", "-w", workdir,
                # tests hand workers paths in the temporary directory, as to a node's /tmp
                "-v", f"{tmp}:{tmp}"]
        for key in env:
            if key not in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYENV_VERSION"):
                argv += ["-e", key]
        cli_env = {**os.environ, **env}
        subprocess.run([*argv, container.get("image", ""), *command], env=cli_env,
                       capture_output=True, timeout=60, check=True)
        return ["docker", "start", "--attach", _container_name(run)], cli_env

    def _terminated(self, run: _Run, code: int, reason: str, message: str | None) -> None:
        state: Json = {"terminated": {"exitCode": code, "reason": reason,
                                      "finishedAt": now_iso()}}
        if message:
            state["terminated"]["message"] = message
        status: Json = {"phase": "Succeeded" if code == 0 and run.override is None else "Failed"}
        if run.override == "Evicted":
            status.update(reason="Evicted", message="The node was low on resource: memory. "
                          "(emulated eviction)")
        pod = self.store.get("pods", run.namespace, run.name) or {}
        status["containerStatuses"] = [_container_status(pod, state)]
        self._set_status(run, status)
        if run.remove_on_exit:
            self.store.delete("pods", run.namespace, run.name, uid=run.uid)

    def _terminate(self, run: _Run, proc: subprocess.Popen[bytes], grace: float) -> None:
        self._signal(run, signal.SIGTERM)
        if not run.exited.wait(grace):
            self._signal(run, signal.SIGKILL)

    def _signal(self, run: _Run, sig: int) -> None:
        if run.proc is None:
            return
        if self.runtime == "docker":  # the CLI cannot forward SIGKILL: ask the engine
            action = (["rm", "--force"] if sig == signal.SIGKILL  # any state: kill and remove
                      else ["kill", f"--signal={int(sig)}"])
            subprocess.run(["docker", *action, _container_name(run)],
                           capture_output=True, timeout=30, check=False)
        else:
            _signal(run.proc, sig)

    def _waiting(self, run: _Run, pod: Json, reason: str, message: str) -> None:
        self._set_status(run, {"containerStatuses": [_container_status(pod, {"waiting": {
            "reason": reason, "message": message}})]})

    def _set_status(self, run: _Run, changes: Json) -> None:
        self.store.update("pods", run.namespace, run.name,
                          lambda p: p.setdefault("status", {}).update(changes), uid=run.uid)


def _container_status(pod: Json, state: Json, ready: bool = False) -> Json:
    container = (pod.get("spec", {}).get("containers") or [{}])[0]
    return {"name": container.get("name", ""), "image": container.get("image", ""),
            "imageID": "", "ready": ready, "restartCount": 0,
            "started": "running" in state, "state": state}


def _log_name(namespace: str, name: str, uid: str) -> str:
    return f"{namespace}_{name}_{uid}.log"


def _container_name(run: _Run) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-",
                  f"k8s-emu-{run.namespace}-{run.name}-{run.uid[:8]}")


def _image_present(image: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                          timeout=30, check=False)
    return done.returncode == 0


def _signal(proc: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
