"""``fiberexec cleanup``: remove workers whose executor is gone.

Docker and Kubernetes: the backend module's ``remove_stray`` removes containers, pods and
Secrets by label. Local: a process is a stray worker when it runs ``python -m
fiberexec.worker`` in this PID namespace, dials a loopback address (the local backend never
uses another), and nothing in this network namespace listens on that address any more, i.e.
its executor is gone. Only such processes are signalled, through a pidfd so a recycled pid is
never hit: SIGTERM, then SIGKILL if it has not exited within a grace period.

SSH: ``remove_stray`` visits the hosts of the configured ``backend_options`` and stops
the workers the ssh backend started there.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fiberexec import _contract

PROC = Path("/proc")
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
LOOPBACK_HOSTS = ("127.", "[::1]", "localhost")


@dataclass(frozen=True)
class LocalWorker:
    pid: int
    executor_id: str
    worker_id: str
    address: str

    @property
    def port(self) -> int | None:
        tail = self.address.rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return None


def is_worker_cmdline(argv: list[str]) -> bool:
    """``<python> -m fiberexec.worker`` and nothing else."""
    return (len(argv) == 3 and "python" in Path(argv[0]).name
            and argv[1:] == ["-m", "fiberexec.worker"])


def _worker(pid: int) -> LocalWorker | None:
    raw = _read(PROC / str(pid) / "cmdline")
    if raw is None or not is_worker_cmdline(raw.decode(errors="replace").split("\0")[:-1]):
        return None
    environ = _read(PROC / str(pid) / "environ") or b""
    env = dict(e.partition("=")[::2] for e in environ.decode(errors="replace").split("\0") if e)
    address = env.get(_contract.ENV_ADDRESS, "")
    if not address:
        return None
    return LocalWorker(pid, env.get(_contract.ENV_EXECUTOR_ID, ""),
                       env.get(_contract.ENV_WORKER_ID, ""), address)


def _same_namespace(pid: int, kind: str) -> bool:
    try:
        return os.readlink(PROC / str(pid) / "ns" / kind) == os.readlink(PROC / "self/ns" / kind)
    except OSError:
        return False


def local_workers() -> Iterator[LocalWorker]:
    """Every worker process of this PID namespace (skipping this process)."""
    for entry in PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            worker = _worker(int(entry.name))
            if worker is not None and _same_namespace(worker.pid, "pid"):
                yield worker


def listening_ports() -> set[int]:
    """TCP ports something listens on in this network namespace."""
    ports = set()
    for table in ("tcp", "tcp6"):
        raw = _read(PROC / "net" / table) or b""
        for line in raw.decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def is_stray(worker: LocalWorker, listening: set[int]) -> bool:
    host = worker.address.removeprefix("tcp://")
    return (host.startswith(LOOPBACK_HOSTS) and worker.port is not None
            and worker.port not in listening and _same_namespace(worker.pid, "net"))


def stray_local_workers(executor_id: str | None = None) -> list[LocalWorker]:
    listening = listening_ports()
    return [w for w in local_workers()
            if is_stray(w, listening) and executor_id in (None, w.executor_id)]


def _wait_exit(pidfd: int, timeout: float) -> bool:
    readable, _, _ = select.select([pidfd], [], [], timeout)  # a pidfd is readable on exit
    return bool(readable)


def terminate(worker: LocalWorker, grace: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` seconds; True if it is gone."""
    try:
        pidfd = os.pidfd_open(worker.pid)
    except ProcessLookupError:
        return True
    try:
        if _worker(worker.pid) != worker:  # checked after opening: the pid cannot be reused now
            return False
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, sig)
            if _wait_exit(pidfd, wait):
                return True
        return False
    finally:
        os.close(pidfd)


def cleanup_local(executor_id: str | None) -> list[str]:
    lines = []
    for worker in stray_local_workers(executor_id):
        gone = terminate(worker)
        lines.append(f"local: {'stopped' if gone else 'could not stop'} worker "
                     f"{worker.worker_id or '?'} of executor {worker.executor_id or '?'} "
                     f"(pid {worker.pid}, dialing {worker.address})")
    return lines or ["local: no stray workers"]


def cleanup_remote(backend: str, module: str, executor_id: str | None,
                   namespace: str | None) -> list[str]:
    """Call ``remove_stray`` of the backend's module, if it is importable and has one."""
    try:
        mod: Any = importlib.import_module(module)
    except ImportError as exc:
        return [f"{backend}: skipped ({exc})"]
    remove = getattr(mod, "remove_stray", None)
    if remove is None:
        return [f"{backend}: skipped (the backend has no remove_stray)"]
    kwargs: dict[str, Any] = {"executor_id": executor_id}
    if namespace is not None and backend == "kubernetes":
        kwargs["namespace"] = namespace
    try:
        if backend == "ssh":  # which hosts to visit: the configured backend_options
            kwargs.update(_configured_options(backend))
        count = remove(**kwargs)
    except Exception as exc:  # an engine or cluster that is not there is reported, not raised
        return [f"{backend}: skipped ({str(exc).splitlines()[0] if str(exc) else exc!r})"]
    return [f"{backend}: removed {count} stray object(s)"]


def _configured_options(backend: str) -> dict[str, Any]:
    """``backend_options`` of the resolved configuration, when they are for ``backend``."""
    from fiberexec._config import resolve

    config = resolve(None, backend=None, min_workers=None, shards=None, memory=None, cpu=None,
                     gpu=None)
    options = dict(config.backend_options)
    return options if config.backend == backend or "hosts" in options else {}
