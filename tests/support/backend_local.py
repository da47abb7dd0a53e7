"""Test support for the local backend: nothing to start; leaks are worker processes."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import psutil

from fiberexec.backend import ENV_LOCAL_ADDRESS, WorkerHandle, WorkerSpec, shared_launchers
from fiberexec.backends.local import LocalBackend
from fiberexec.testing import Harness
from tests.support.kit import BackendKit


def descendants_running(program: str) -> list[psutil.Process]:
    """This process's live descendants whose command line mentions ``program``."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if program in " ".join(proc.cmdline()) and proc.status() != "zombie":
                found.append(proc)
    return found


def worker_processes() -> list[psutil.Process]:
    """This process's descendants that run the worker program (not the launchers they were
    forked from, whose command line they share)."""
    running = descendants_running("fiberexec.worker")
    launchers = {p.pid for p in launcher_processes(running)}
    return [p for p in running if p.pid not in launchers]


def launcher_processes(running: list[psutil.Process] | None = None) -> list[psutil.Process]:
    """The worker launchers among this process's descendants."""
    running = descendants_running("fiberexec.worker") if running is None else running
    return [p for p in running if _is_launcher(p)]


def _is_launcher(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        if "--launcher" in proc.cmdline():
            parent = proc.parent()
            return parent is None or "--launcher" not in parent.cmdline()
    return False


def _leaks() -> list[str]:
    """Workers and launchers left running, but for this process's launchers, which stay for
    the next executor as the stdlib's forkserver does (`SharedLaunchers`): a worker they
    forked and left running is a leak of its own."""
    kept = set(shared_launchers.pids())
    procs = [p for p in descendants_running("fiberexec.worker") if p.pid not in kept]
    if procs:  # workers exit within moments of shutdown(wait=False); give them that, bounded
        _, procs = psutil.wait_procs(procs, timeout=5)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return [f"worker or launcher process {p.pid}" for p in procs]


@contextlib.contextmanager
def backend_session() -> Iterator[BackendKit]:
    # The contract's logs checks need the output kept: capture_output=True.
    contract = Harness(make_backend=lambda: LocalBackend(capture_output=True))
    yield BackendKit(name="local", make_backend=LocalBackend, leaks=_leaks, contract=contract,
                     settings={"FIBEREXEC_BACKEND": "local"})


class NetworkLocalBackend(LocalBackend):
    """Local worker processes that reach the executor over the network link, as workers on
    other hosts do (they are given no local socket), so a test can use that link here."""

    workers_share_host = False

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        env = {k: v for k, v in spec.env.items() if k != ENV_LOCAL_ADDRESS}
        return super().start_worker(dataclasses.replace(spec, env=env))
