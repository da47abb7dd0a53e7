"""Stray local workers: worker processes whose executor is gone, found and stopped safely.

A process is a stray worker when it runs ``python -m fiberexec.worker`` (after the
interpreter's options, if any; or is forked from the worker launcher, ``python -m
fiberexec.worker --launcher FD``, whose command line it keeps) in this PID namespace and its
executor is gone: the executor process its environment names (``FIBEREXEC_EXECUTOR_PID``,
pid and start time, so a recycled pid is not taken for it) no longer runs, or, for a worker
that names none, nothing in this network namespace listens on the loopback address it dials
any more. Only such processes are signalled, through a pidfd so a recycled pid is never hit:
SIGTERM, then SIGKILL if it has not exited within a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fiberexec.backend import (
    ENV_ADDRESS,
    ENV_EXECUTOR_ID,
    ENV_LOCAL_ADDRESS,
    ENV_WORKER_ID,
    Sweep,
    readable_within,
)

PROC = Path("/proc")
ENV_EXECUTOR_PID = "FIBEREXEC_EXECUTOR_PID"
LISTEN, ESTABLISHED = "0A", "01"  # TCP states in /proc/net/tcp
LOOPBACK_HOSTS = ("127.", "[::1]", "localhost")


@dataclass(frozen=True)
class LocalWorker:
    pid: int
    executor_id: str
    worker_id: str
    address: str
    executor_pid: str = ""
    launcher: bool = False  # the program's worker launcher (`fiberexec._launcher`)
    local_address: str = ""  # the abstract Unix name it may have connected on instead

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
    """``<python> [options] -m fiberexec.worker``, maybe with ``--launcher FD``, and nothing
    else (the options are the interpreter's own, as the local backend passes them on: ``-O``,
    ``-Werror``, ``-X dev``)."""
    if len(argv) >= 5 and argv[-2] == "--launcher" and argv[-1].isdigit():
        argv = argv[:-2]
    if len(argv) < 3 or "python" not in Path(argv[0]).name or argv[-2:] != [
            "-m", "fiberexec.worker"]:
        return False
    options = iter(argv[1:-2])
    for option in options:
        if not option.startswith("-") or option == "-m":
            return False
        if option == "-X" and next(options, "-").startswith("-"):  # -X takes a value
            return False
    return True


def executor_pid(pid: int) -> str:
    """``pid:start time``: names a process for as long as it runs, never a later one."""
    return f"{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    raw = _read(PROC / str(pid) / "stat") or b""
    fields = raw.decode(errors="replace").rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else "?"


def _executor_alive(named: str) -> bool:
    pid, _, started = named.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


def _worker(pid: int) -> LocalWorker | None:
    raw = _read(PROC / str(pid) / "cmdline")
    argv = [] if raw is None else raw.decode(errors="replace").split("\0")[:-1]
    if not is_worker_cmdline(argv):
        return None
    environ = _read(PROC / str(pid) / "environ") or b""
    env = {name: value.strip() for name, _, value in (  # (a forked worker's are padded)
        e.partition("=") for e in environ.decode(errors="replace").split("\0") if e)}
    address, owner = env.get(ENV_ADDRESS, ""), env.get(ENV_EXECUTOR_PID, "")
    if not (address or owner):
        return None
    launcher = argv[-2:-1] == ["--launcher"] and not env.get(ENV_WORKER_ID)
    return LocalWorker(pid, env.get(ENV_EXECUTOR_ID, ""), env.get(ENV_WORKER_ID, ""),
                       address, owner, launcher, env.get(ENV_LOCAL_ADDRESS, ""))


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
    """TCP ports in use by a live process of this network namespace: listened on, or the
    local end of a connection (an executor that took its worker's connection may listen on
    that port no more; while it lives, the connection does)."""
    ports = set()
    for table in ("tcp", "tcp6"):
        raw = _read(PROC / "net" / table) or b""
        for line in raw.decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] in (LISTEN, ESTABLISHED):
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def bound_unix_names() -> set[str]:
    """The abstract Unix socket names bound in this network namespace (without the ``@``)."""
    raw = _read(PROC / "net" / "unix") or b""
    return {fields[-1][1:] for line in raw.decode(errors="replace").splitlines()[1:]
            if len(fields := line.split()) > 7 and fields[-1].startswith("@")}


def is_stray(worker: LocalWorker, listening: set[int], bound: set[str] | None = None) -> bool:
    """Whether ``worker``'s executor is gone: by its pid if the worker names it (the local
    backend's), else by the addresses it dials. A worker of another backend that runs here
    (a pod of a cluster on this machine, an ssh host that is this one) is live while its
    executor holds the connection: on the TCP port (listened on, or connected), or on the
    abstract Unix name it may have connected on instead."""
    if worker.executor_pid:
        return not _executor_alive(worker.executor_pid)
    host = worker.address.removeprefix("tcp://")
    if not (host.startswith(LOOPBACK_HOSTS) and worker.port is not None
            and worker.port not in listening and _same_namespace(worker.pid, "net")):
        return False
    if worker.local_address:
        names = bound_unix_names() if bound is None else bound
        return worker.local_address not in names
    return True


def stray_local_workers(executor_id: str | None = None) -> list[LocalWorker]:
    """Workers whose executor is gone (of ``executor_id``, if given)."""
    return [w for w, held in _judged() if not held and executor_id in (None, w.executor_id)]


def _judged() -> list[tuple[LocalWorker, bool]]:
    """Every worker here, and whether its executor holds its lease (still runs)."""
    listening, bound = listening_ports(), bound_unix_names()
    return [(w, not is_stray(w, listening, bound)) for w in local_workers()]


def _wait_exit(pidfd: int, timeout: float) -> bool:
    return readable_within(pidfd, timeout)  # a pidfd is readable on exit


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


def remove_stray_local(sweep: Sweep) -> list[str]:
    """Stop the workers ``sweep`` picks (by default those whose executor is gone); one line
    per worker."""
    lines = []
    for worker, held in _judged():
        if not sweep.picks(worker.executor_id, held):
            continue
        gone = sweep.dry_run or terminate(worker)
        verb = sweep.verb() if gone else "could not stop"
        if worker.launcher:  # it forks a program's workers, and names no executor
            program = worker.executor_pid.partition(":")[0] or "?"
            lines.append(f"{verb} the worker launcher of program pid {program} "
                         f"(pid {worker.pid}: {sweep.why(held)})")
            continue
        dialing = f", dialing {worker.address}" if worker.address else ""
        lines.append(f"{verb} worker {worker.worker_id or '?'} of executor "
                     f"{worker.executor_id or '?'} (pid {worker.pid}{dialing}: "
                     f"{sweep.why(held)})")
    return lines or ["no stray workers"]
