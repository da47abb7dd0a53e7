"""Test support for the ssh backend: the multi-host test bed, and its worker hosts' sshd.

The session builds the test bed (tests/testbed: network namespaces, one sshd per worker host,
this process on the executor host) and fails loudly when it cannot. Leaks are processes of
the ssh backend still alive anywhere in the test bed: remote wrappers and workers on the
worker hosts, and ssh clients on the executor host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

import fiberexec
from fiberexec.backend import Backend, WorkerHandle, WorkerSpec, WorkerStatus
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends.ssh import SSHBackend, remove_stray
from fiberexec.testing import Harness
from tests.support.kit import BackendKit
from tests.testbed.session import Lab, shared

SLOTS = 2  # workers per host in the behaviour suite


@dataclass
class SSHKit(BackendKit):
    lab: Lab | None = None
    same_host: bool = False  # worker hosts are network namespaces, each with its /dev/shm


def python_here(lab: Lab) -> str:
    """The tox env's Python, importing the same fiberexec as this process (a checkout's,
    not the installed one): a shim in the test bed's directory that every host sees."""
    shim = lab.site.root / "python-here"
    if not shim.exists():
        checkout = Path(fiberexec.__file__).resolve().parents[1]
        shim.write_text(f"#!/bin/sh\nexport PYTHONPATH={shlex.quote(str(checkout))}\n"
                        f"exec {shlex.quote(sys.executable)} \"$@\"\n")
        shim.chmod(0o755)
    return str(shim)


def backend_options(lab: Lab, **overrides: Any) -> dict[str, Any]:
    """SSHBackend arguments for the test bed's worker hosts (the tox env's Python there)."""
    return {
        "hosts": lab.targets(),
        "python": python_here(lab),
        "slots": SLOTS,
        "ssh_config": str(lab.site.ssh_config),
        "connect_timeout": 5.0,
        **overrides,
    }


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def ssh_processes(lab: Lab) -> list[psutil.Process]:
    """Live processes of the ssh backend in the test bed's namespaces."""
    inodes = {lab.bed.inode(h) for h in lab.bed.hosts}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _netns_inode(proc.pid) not in inodes or proc.status() == "zombie":
                continue
            argv = proc.cmdline()
            marked = any(remote.HOST_MARK in a or remote.CLEANUP_MARK in a for a in argv)
            worker = argv[1:3] == ["-m", "fiberexec.worker"] and remote.ENV_MARK in proc.environ()
            if marked or worker:
                found.append(proc)
    return found


def leaks(lab: Lab) -> list[str]:
    procs = ssh_processes(lab)
    if procs:  # sessions wind down within moments of shutdown; give them that, bounded
        _, procs = psutil.wait_procs(procs, timeout=10)
    described = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
            proc.kill()
    return described


@contextlib.contextmanager
def backend_session() -> Iterator[BackendKit]:
    """The `BackendKit` for the ssh backend (see tests/support/README.md)."""
    with shared() as lab:

        def make_backend() -> Backend:
            return SSHBackend(**backend_options(lab))

        contract = Harness(
            make_backend=make_backend, timeout=60.0,
            remove_stray=lambda _backend, sweep: remove_stray(
                sweep=sweep, **backend_options(lab)),
        )
        yield SSHKit(name="ssh", make_backend=make_backend, leaks=lambda: leaks(lab),
                     contract=contract, executor_kwargs={"workdir": str(Path.cwd())}, lab=lab,
                     settings={"FIBEREXEC_BACKEND": "ssh",
                               "FIBEREXEC_BACKEND_OPTIONS": json.dumps(backend_options(lab))})


def spec(worker_id: str, *code: str) -> WorkerSpec:
    """A job that runs ``python -c`` code instead of the worker program."""
    return WorkerSpec(worker_id=worker_id, executor_id="t", command=("python", "-c", *code))


def finished(backend: SSHBackend, handle: WorkerHandle, timeout: float = 30) -> WorkerStatus:
    """Wait for the watch listener to report the job's end."""
    done = threading.Event()
    seen: list[WorkerStatus] = []
    backend.watch(handle, lambda _h, status: (seen.append(status), done.set()))
    assert done.wait(timeout), f"{handle} did not finish within {timeout}s"
    return seen[0]
