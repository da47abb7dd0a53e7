"""Workers as Docker containers, one container per worker.

::

    start_worker(spec) --create+start--> container  (host network, auto-removed on exit,
         |                           labels fiberexec=worker, executor, worker, lease)
         +-- first call opens one /events stream (die, oom) before any container exists
         +-- and holds the executor's lease container (`_docker_lease`) while it has workers
                                   |
    events thread: oom -> remember; die -> keep exit code (+ "OOMKilled"), keep the last log
                   lines (best effort), call the watch listener once
    status/logs: inspect the container while it exists, else what the events thread kept
    stop/close:  docker stop (SIGTERM, SIGKILL after grace), then remove and wait until removed

Containers are started with ``auto_remove=True``, so none outlives its worker even when the
executor is SIGKILLed (workers exit when the executor goes away). Because the daemon removes a
container right after it exits, the exit code and the OOM flag are taken from the event
stream, which is subscribed before the first container is created so no exit is missed.

Docker reports a process killed by signal ``N`` as exit code ``128 + N``; `WorkerStatus`
carries it as ``-N``. A worker that calls ``sys.exit(137)`` itself is indistinguishable.

`remove_stray` (``fiberexec cleanup``) removes a worker container only when its executor's
lease container no longer runs: the executor is gone, however it ended.

Every docker SDK and ``requests`` error is translated in `_translate`, and only there.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from fiberexec.backend import (
    EXECUTOR_LABEL,
    LABEL_KEY,
    LEASE_LABEL,
    WORKER_LABEL,
    Backend,
    BackendError,
    ConfigurationError,
    ExitListener,
    ExitWatch,
    MasterRequest,
    PermanentBackendError,
    Probe,
    Resources,
    RetryPolicy,
    Sweep,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    lease_name,
)
from fiberexec.backends import _docker_lease, _docker_master
from fiberexec.backends._docker_lease import DockerLease

__all__ = ["DockerBackend", "container_name", "remove_stray"]

log = logging.getLogger("fiberexec.docker")

_EXTRA_HINT = "the docker backend needs the docker package: pip install 'fiberexec[docker]'"
#: What to do when no engine answers (it must work for anyone who installed fiberexec with pip).
ENGINE_HINT = _docker_master.ENGINE_HINT
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
_SIGNAL_BASE = 128  # Docker's exit code for death by signal N is 128 + N
_KEPT_LINES = 500  # log lines kept per container that exited
_KEPT_EXITS = 4096  # exits remembered after their containers are gone
_EVENTS_FILTER = {"type": ["container"], "event": ["die", "oom"], "label": [f"{LABEL_KEY}=worker"]}


def _import_docker() -> Any:
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_EXTRA_HINT) from exc
    return docker


def container_name(spec: WorkerSpec) -> str:
    """``fiberexec-<executor>-<worker>``, with characters Docker refuses replaced by ``-``."""
    raw = f"fiberexec-{spec.executor_id}-{spec.worker_id}"
    return _NAME_UNSAFE.sub("-", raw)[:200]


def _exit_code(code: int) -> int:
    """Docker's exit code, with ``128 + N`` (killed by signal N) turned into ``-N``."""
    if _SIGNAL_BASE < code <= _SIGNAL_BASE + 64:
        return -(code - _SIGNAL_BASE)
    return code


def _engine(base_url: str | None) -> str:
    return base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


@contextlib.contextmanager
def _translate(
    action: str, *, engine: str, image: str | None = None, name: str | None = None
) -> Iterator[None]:
    """Map docker SDK and ``requests`` errors to fiberexec's error tree (the only place)."""
    docker = _import_docker()
    import requests

    what = f"{action} {name}" if name else action
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise PermanentBackendError(
            f"cannot {what}: image {image!r} not found on the Docker engine at {engine}; "
            f"build or pull it there first (docker pull {image}) or pass another image="
        ) from exc
    except docker.errors.APIError as exc:
        raise _from_api_error(exc, what) from exc
    except (requests.exceptions.RequestException, docker.errors.DockerException) as exc:
        # The client's version probe wraps the connection error in a DockerException.
        if isinstance(exc, docker.errors.DockerException) and not isinstance(
            exc.__cause__, requests.exceptions.RequestException
        ):
            raise PermanentBackendError(f"cannot {what}: {exc}") from exc
        raise TransientBackendError(
            f"cannot {what}: the Docker engine at {engine} is unreachable ({exc}); {ENGINE_HINT}"
        ) from exc


def _from_api_error(exc: Any, what: str) -> BackendError:
    status = int(exc.status_code or 0)
    detail = exc.explanation or str(exc)
    if status == 409:
        return TransientBackendError(
            f"cannot {what}: Docker reports a conflict (409): {detail}; if a container is left "
            "over from an earlier run, remove it with fiberexec.backends.docker.remove_stray()"
        )
    if status == 429 or status >= 500:
        if "could not select device driver" in detail:  # no GPU runtime: retrying cannot help
            return PermanentBackendError(
                f"cannot {what}: {detail}; this engine has no GPU runtime, so drop gpu= from "
                "the worker resources or install the NVIDIA container toolkit"
            )
        retry_after = exc.response.headers.get("Retry-After") if exc.response is not None else None
        return TransientBackendError(
            f"cannot {what}: the Docker engine failed ({status}): {detail}",
            retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
        )
    if status == 400:
        return PermanentBackendError(
            f"cannot {what}: Docker rejected the container settings (400): {detail}; fix "
            "image=, the worker resources (cpu, memory, gpu) or extra_run_kwargs"
        )
    return PermanentBackendError(f"cannot {what}: Docker answered {status}: {detail}")


def _is_gone(exc: BaseException) -> bool:
    """True for "no such container" and "removal already in progress" answers."""
    docker = _import_docker()
    return isinstance(exc, docker.errors.NotFound) or (
        isinstance(exc, docker.errors.APIError) and exc.status_code == 409
    )


def _remember(table: dict[str, Any], key: str, value: Any, limit: int) -> None:
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]  # dicts keep insertion order: drop the oldest


def _state_to_status(state: Mapping[str, Any]) -> WorkerStatus:
    status = state.get("Status")
    if status == "created":
        return WorkerStatus(WorkerState.PENDING)
    if status in ("running", "paused", "restarting"):
        return WorkerStatus(WorkerState.RUNNING)
    reason = "OOMKilled" if state.get("OOMKilled") else (state.get("Error") or None)
    code = _exit_code(int(state.get("ExitCode") or 0))
    return WorkerStatus(WorkerState.EXITED, exit_code=code, reason=reason)


class _ExitEvents:
    """One thread reading the engine's die/oom events; reconnects with ``since`` if cut off."""

    def __init__(self, client: Any, on_event: Callable[[dict[str, Any]], None]) -> None:
        self._client = client
        self._on_event = on_event
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._since = int(time.time())  # resubscribing replays events from here on
        self._thread = threading.Thread(
            target=self._run, name="fiberexec-docker-events", daemon=True
        )

    def start(self) -> None:
        """Subscribe now (so later exits cannot be missed), then read in the background."""
        self._stream = self._client.events(decode=True, filters=_EVENTS_FILTER)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.5
        while not self._closed.is_set():
            for event in self._stream:  # blocks until an event or close() shuts the socket
                self._since = int(event.get("time") or 0) or self._since
                self._dispatch(event)
                delay = 0.5
            if not self._closed.wait(delay):  # cut off (engine restart): resubscribe
                delay = min(delay * 2, 10.0)
                self._reopen()

    def _dispatch(self, event: dict[str, Any]) -> None:
        try:
            self._on_event(event)
        except Exception:  # a failing listener must not stop exit reporting for the others
            log.exception("fiberexec docker: handling event %s failed", event.get("status"))

    def _reopen(self) -> None:
        try:
            stream = self._client.events(decode=True, filters=_EVENTS_FILTER, since=self._since)
        except Exception as exc:
            log.warning("fiberexec docker: event stream lost, resubscribing failed: %s", exc)
            return
        with self._lock:
            self._stream = stream
        if self._closed.is_set():
            stream.close()

    def close(self, timeout: float = 5.0) -> None:
        self._closed.set()
        with self._lock:
            if self._stream is not None:
                self._stream.close()
        if self._thread.is_alive():
            self._thread.join(timeout)


class DockerBackend(Backend):
    """Run each worker as a Docker container on the host network.

    Args:
        image: image for specs that name none; it must contain fiberexec and its dependencies
            (see the project's ``Dockerfile``) and already be on the engine (it is not pulled).
        base_url: engine address (``unix:///var/run/docker.sock``, ``tcp://host:2376``);
            default: ``DOCKER_HOST`` or the local socket.
        client: a ``docker.DockerClient`` to use instead (it is not closed by `close`).
        mount_workdir: bind-mount the spec's workdir (or the current directory) at the same
            path and start there, and the program's script's directory if it is elsewhere,
            so workers import the same user modules. Only meaningful when the engine runs on
            this machine.
        ipc_host: share the host's IPC namespace and ``/dev/shm`` (large payloads travel
            through shared memory).
        init: run Docker's init as PID 1, so SIGTERM reaches the worker and zombies are reaped.
        extra_run_kwargs: more ``containers.create`` arguments, applied last (``user=``,
            ``volumes=``, ``runtime=``...); a mapping merges into the one built from the spec.
        stop_grace: seconds between SIGTERM and SIGKILL when `stop` is given no grace.
        timeout: seconds any single engine request may take.

    The worker environment (including ``secret_env``) is visible to anyone who can run
    ``docker inspect`` on the engine.

    Example:
        >>> from fiberexec import FiberExecutor
        >>> with FiberExecutor(4, backend=DockerBackend(image="me/app:1")) as ex:  # doctest: +SKIP
        ...     ex.submit(abs, -1).result()
        1
    """

    name = "docker"
    enforces_resources = True
    resource_limits: ClassVar[Mapping[str, str]] = {
        "cpu": "the container's nano_cpus",
        "memory": "the container's mem_limit, without swap",
        "gpu": "a GPU device request (needs the engine's NVIDIA runtime)",
    }

    def __init__(
        self,
        image: str | None = None,
        *,
        base_url: str | None = None,
        client: Any = None,
        mount_workdir: bool = True,
        ipc_host: bool = True,
        init: bool = True,
        extra_run_kwargs: Mapping[str, Any] | None = None,
        stop_grace: float = 2.0,
        timeout: float = 60.0,
    ) -> None:
        self._docker = _import_docker()
        if stop_grace < 0:
            raise ConfigurationError(f"stop_grace must be >= 0 seconds, got {stop_grace}")
        if timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {timeout}")
        if client is not None and base_url is not None:
            raise ConfigurationError("pass base_url= or client=, not both")
        self.image = image
        self.base_url = base_url
        self.mount_workdir = mount_workdir
        self.ipc_host = ipc_host
        self.init = init
        self.extra_run_kwargs = dict(extra_run_kwargs or {})
        self.stop_grace = stop_grace
        self.timeout = timeout
        self._client: Any = client
        self._owns_client = client is None
        self._events: _ExitEvents | None = None
        self._exit_watch = ExitWatch()
        self._lock = threading.Lock()
        self._started: dict[str, WorkerHandle] = {}  # container id -> handle, until stopped
        self._exits: dict[str, WorkerStatus] = {}  # container id -> exit seen on the stream
        self._oom: set[str] = set()
        self._kept_logs: dict[str, str] = {}
        self._remove_retry = RetryPolicy(attempts=3, deadline=min(timeout, 30.0))
        self._leases: dict[str, DockerLease] = {}  # executor id -> its lease on the engine
        self._holding: Counter[str] = Counter()  # executor id -> containers it has or starts
        self._owners: dict[str, str] = {}  # container id -> executor id
        self._closes = 0  # calls of close(): a start it overtook makes no lease or container

    # -- plumbing --------------------------------------------------------------------------

    def _errors(self, action: str, **names: str | None) -> contextlib.AbstractContextManager[None]:
        return _translate(action, engine=_engine(self.base_url), **names)

    def _api(self) -> Any:
        """The low-level API client, connecting on first use."""
        with self._lock:
            if self._client is None:
                with self._errors("connect to the Docker engine"):
                    self._client = (
                        self._docker.DockerClient(base_url=self.base_url, timeout=self.timeout)
                        if self.base_url
                        else self._docker.from_env(timeout=self.timeout)
                    )
            return self._client.api

    def _ensure_events(self) -> None:
        api = self._api()
        with self._lock:
            if self._events is not None:
                return
            events = _ExitEvents(api, self._on_event)
            with self._errors("subscribe to Docker events"):
                events.start()
            self._events = events

    # -- starting --------------------------------------------------------------------------

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        image = spec.image or self.image
        if not image:
            raise ConfigurationError(
                "the docker backend needs an image, got none; pass image='me/app:1' "
                "to FiberExecutor or DockerBackend"
            )
        with self._lock:
            closes = self._closes
        self._ensure_events()
        self._hold_lease(spec, image, closes)
        name = container_name(spec)
        try:
            kwargs = self._create_kwargs(spec, name)
            with self._errors("create container", image=image, name=name):
                container = self._client.containers.create(image, list(spec.command), **kwargs)
        except BaseException:
            self._let_go(spec.executor_id)
            raise
        handle = WorkerHandle(spec.worker_id, str(container.id))
        with self._lock:
            self._started[handle.ref] = handle
            self._owners[handle.ref] = spec.executor_id
        try:
            with self._errors("start container", image=image, name=name):
                container.start()
        except BackendError:
            self._remove_quietly(handle)  # never started, so auto-remove will not fire
            raise
        return handle

    def _hold_lease(self, spec: WorkerSpec, image: str, closes: int) -> None:
        """Hold the executor's lease before its first worker exists (`_docker_lease`); it is
        let go with the executor's last container."""
        api = self._api()
        with self._lock:
            if self._closes != closes:  # (a start under way as the executor ended)
                raise PermanentBackendError(
                    f"the docker backend was closed: worker {spec.worker_id} is not started")
            lease = self._leases.setdefault(spec.executor_id, DockerLease(api, spec.executor_id))
            self._holding[spec.executor_id] += 1
        try:
            with self._errors("start the executor's lease container", image=image,
                              name=lease.name):
                lease.acquire(image, spec.command[0])
        except BaseException:
            self._let_go(spec.executor_id)
            raise

    def _let_go(self, executor_id: str) -> None:
        """One container of the executor fewer; with its last, its lease goes."""
        with self._lock:
            self._holding[executor_id] -= 1
            lease = None
            if self._holding[executor_id] <= 0:
                del self._holding[executor_id]
                lease = self._leases.pop(executor_id, None)
        if lease is not None:
            lease.release()

    def _forget(self, ref: str) -> None:
        """A container of ours is gone for good (stopped or removed)."""
        with self._lock:
            handle = self._started.pop(ref, None)
            owner = self._owners.pop(ref, None)
        if handle is not None and owner is not None:
            self._let_go(owner)

    def _create_kwargs(self, spec: WorkerSpec, name: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "name": name,
            "labels": {**spec.all_labels(), LEASE_LABEL: lease_name(spec.executor_id)},
            "environment": {**spec.env, **spec.secret_env},
            "network_mode": "host",
            "auto_remove": True,
            "init": self.init,
        }
        if self.ipc_host:
            kwargs["ipc_mode"] = "host"
        if self.mount_workdir:
            workdir = spec.workdir or os.getcwd()
            kwargs["volumes"] = {workdir: {"bind": workdir, "mode": "rw"}}
            kwargs["working_dir"] = workdir
            script = spec.script_dir  # a script run from elsewhere imports modules beside it
            if script and os.path.isdir(script) and not _inside(script, workdir):
                kwargs["volumes"][script] = {"bind": script, "mode": "rw"}
        elif spec.workdir:
            kwargs["working_dir"] = spec.workdir
        kwargs.update(self._resource_kwargs(spec.resources))
        for key, extra in self.extra_run_kwargs.items():  # mappings (volumes=, labels=) merge
            base = kwargs.get(key)
            both = isinstance(extra, Mapping) and isinstance(base, Mapping)
            kwargs[key] = {**(base or {}), **extra} if both else extra
        return kwargs

    def _resource_kwargs(self, resources: Resources) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if resources.cpu is not None:
            kwargs["nano_cpus"] = round(resources.cpu * 1e9)
        if resources.memory is not None:
            # No swap on top: a worker over its limit is OOM-killed and reported, not slowed.
            kwargs["mem_limit"] = kwargs["memswap_limit"] = resources.memory
        if resources.gpu:
            request = self._docker.types.DeviceRequest(count=resources.gpu, capabilities=[["gpu"]])
            kwargs["device_requests"] = [request]
        return kwargs

    # -- events ----------------------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> None:
        ref = str(event.get("id", ""))
        with self._lock:
            handle = self._started.get(ref)
            if handle is None or ref in self._exits:  # not ours, or replayed after a reconnect
                return
            if event.get("status") == "oom":
                self._oom.add(ref)
                return
        code = int(event.get("Actor", {}).get("Attributes", {}).get("exitCode", -1))
        reason = "OOMKilled" if ref in self._oom else None
        self._keep_logs(ref)
        with self._lock:
            status = WorkerStatus(WorkerState.EXITED, exit_code=_exit_code(code), reason=reason)
            _remember(self._exits, ref, status, _KEPT_EXITS)
            self._oom.discard(ref)
        self._exit_watch.report(handle, status)

    def _keep_logs(self, ref: str) -> None:
        """Read the last lines of a container that just died, before the daemon removes it.

        This races with the daemon's auto-removal: when removal wins, nothing is kept and
        `logs` returns "". In practice the read (one local request) usually wins.
        """
        try:
            raw = self._client.api.logs(ref, stdout=True, stderr=True, tail=_KEPT_LINES)
        except Exception as exc:
            log.debug("fiberexec docker: logs of %s lost to auto-removal: %s", ref[:12], exc)
            return
        with self._lock:
            _remember(self._kept_logs, ref, bytes(raw).decode(errors="replace"), _KEPT_EXITS)

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        with self._lock:
            ours = handle.ref in self._started and self._events is not None
            recorded = self._exits.get(handle.ref)
        self._exit_watch.watch(handle, listener)
        if not ours:  # not started here: fall back to polling status
            self._exit_watch.poll(self.status, interval=self.poll_interval,
                                  name=f"fiberexec-{self.name}-watch")
            return
        with self._lock:  # the exit may have been recorded while we registered
            recorded = recorded or self._exits.get(handle.ref)
        if recorded is not None:
            self._exit_watch.report(handle, recorded)  # once even if the events thread races

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    # -- inspecting ------------------------------------------------------------------------

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        """The container's state; the exit seen on the event stream once it is removed.

        Raises:
            TransientBackendError: the engine is unreachable.
        """
        with self._lock:
            recorded = self._exits.get(handle.ref)
        if recorded is not None:
            return recorded
        api = self._api()
        with self._errors("inspect container", name=handle.ref[:12]):
            try:
                info = api.inspect_container(handle.ref)
            except self._docker.errors.NotFound:
                return WorkerStatus(WorkerState.UNKNOWN, reason="container removed")
        return _state_to_status(info.get("State") or {})

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        api = self._api()
        with self._errors("read logs of container", name=handle.ref[:12]):
            try:
                raw = api.logs(handle.ref, stdout=True, stderr=True, tail=tail)
            except self._docker.errors.APIError as exc:
                if not _is_gone(exc):
                    raise
                with self._lock:
                    kept = self._kept_logs.get(handle.ref, "")
                return "".join(kept.splitlines(keepends=True)[-tail:]) if tail > 0 else ""
        return bytes(raw).decode(errors="replace")

    # -- stopping --------------------------------------------------------------------------

    def signal(self, handle: WorkerHandle, sig: int) -> None:
        """``docker kill --signal``: the container's init passes ``sig`` on to the worker.

        A container that already exited (or was removed) is left alone.
        """
        api = self._api()
        with self._errors("signal container", name=handle.ref[:12]):
            try:
                api.kill(handle.ref, signal=int(sig))
            except self._docker.errors.APIError as exc:
                if not _is_gone(exc):  # gone, or not running (409)
                    raise

    def stop(self, handle: WorkerHandle, *, grace: float | None = None) -> None:
        """SIGTERM the container, SIGKILL it after ``grace`` seconds, and wait until removed."""
        self.unwatch(handle)
        grace = self.stop_grace if grace is None else grace
        api = self._api()
        with self._errors("stop container", name=handle.ref[:12]):
            try:
                api.stop(handle.ref, timeout=math.ceil(grace))
            except self._docker.errors.APIError as exc:
                if not _is_gone(exc):
                    raise
        self._remove_retry.call(lambda: self._remove(handle))
        self._forget(handle.ref)

    def _remove(self, handle: WorkerHandle) -> None:
        api = self._api()
        with self._errors("remove container", name=handle.ref[:12]):
            try:
                api.remove_container(handle.ref, force=True)
            except self._docker.errors.APIError as exc:
                if not _is_gone(exc):
                    raise
                with contextlib.suppress(self._docker.errors.NotFound):  # auto-removal running
                    api.wait(handle.ref, condition="removed", timeout=self.timeout)

    def _remove_quietly(self, handle: WorkerHandle) -> None:
        try:
            self._remove(handle)
        except BackendError as exc:
            log.warning("fiberexec docker: could not remove container %s: %s", handle.ref, exc)
        self._forget(handle.ref)

    def _stop_quietly(self, handle: WorkerHandle) -> None:
        try:
            self.stop(handle, grace=self.stop_grace)
        except BackendError as exc:
            log.warning("fiberexec docker: could not stop container %s: %s", handle.ref, exc)

    def close(self) -> None:
        """Stop and remove every container this backend started, then stop the event thread."""
        with self._lock:
            self._closes += 1
        with self._lock:
            handles = list(self._started.values())
        if handles:
            with ThreadPoolExecutor(min(16, len(handles)), "fiberexec-docker-stop") as pool:
                list(pool.map(self._stop_quietly, handles))
        for handle in self._exit_watch.clear():  # watched here, started elsewhere
            self.stop(handle, grace=0.5)
        self._exit_watch.stop_polling(timeout=5)
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
            self._holding.clear()
        for lease in leases:  # after the workers: none may look like a stray meanwhile
            lease.release()
        if self._events is not None:
            self._events.close()
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    # -- capabilities of the ``fiberexec`` command ---------------------------------------------

    @classmethod
    def launch_master(cls, request: MasterRequest) -> int:
        """Run the program in a container on the local engine; stream its output."""
        return _docker_master.launch_master(request)

    @classmethod
    def probe(cls) -> Probe:
        return _docker_master.probe()

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """Remove the worker containers ``sweep`` picks (this module's `remove_stray`)."""
        return remove_stray(sweep=sweep) or ["no stray workers"]


def remove_stray(client: Any = None, executor_id: str | None = None, *,
                 sweep: Sweep | None = None) -> list[str]:
    """Remove worker containers whose executor is gone (or those ``sweep`` picks).

    An executor's lease is a container it holds open (`_docker_lease`); a worker container
    goes when its executor holds none on this engine. ``executor_id`` removes that
    executor's workers and lease, live or not. Returns one line per container.

    Example:
        >>> remove_stray(executor_id="3f2a")  # doctest: +SKIP
        ['removed container fiberexec-3f2a-w0 (worker w0 of executor 3f2a: its executor was named)']
    """
    sweep = sweep or Sweep(executor_id=executor_id)
    docker = _import_docker()
    engine = _engine(None) if client is None else str(client.api.base_url)
    with _translate("remove stray containers", engine=engine):
        own = client is None
        client = client if client is not None else docker.from_env(timeout=60)
        try:
            return _sweep_engine(client.api, sweep)
        finally:
            if own:
                client.close()


def _sweep_engine(api: Any, sweep: Sweep) -> list[str]:
    held = _docker_lease.held(api)
    lines = []
    for container in api.containers(all=True, filters={"label": LABEL_KEY}):
        labels = container.get("Labels") or {}
        executor = labels.get(EXECUTOR_LABEL, "")
        kind = labels.get(LABEL_KEY)
        if kind not in ("worker", _docker_lease.LEASE_VALUE):
            continue  # a master of `fiberexec run`: its own program ends it
        lease = labels.get(LEASE_LABEL)
        is_held = None if kind == "worker" and lease is None else executor in held
        if kind == _docker_lease.LEASE_VALUE and not (sweep.executor_id or sweep.everything):
            continue  # a lease goes only with its executor named, or with everything
        if not sweep.picks(executor, is_held):
            continue
        name = (container.get("Names") or ["?"])[0].lstrip("/")
        if not sweep.dry_run:
            _force_remove(api, container["Id"])
        what = f"worker {labels.get(WORKER_LABEL, '?')}" if kind == "worker" else "lease"
        lines.append(f"{sweep.verb()} container {name} ({what} of executor {executor}: "
                     f"{sweep.why(is_held)})")
    return lines


def _force_remove(api: Any, ref: str) -> None:
    try:
        api.remove_container(ref, force=True)
    except Exception as exc:
        if not _is_gone(exc):
            raise
        with contextlib.suppress(_import_docker().errors.NotFound):
            api.wait(ref, condition="removed", timeout=60)


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or within it."""
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == \
        os.path.abspath(folder)
