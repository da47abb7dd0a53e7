"""The ssh backend's host wrapper run on this machine without ssh: how it ends its workers."""

from __future__ import annotations

import sys
import threading
from typing import Any

import psutil

from fiberexec.backend import WorkerState, WorkerStatus
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends._ssh_hosts import SSHHost
from fiberexec.backends._ssh_session import HostSession, Remote

SLEEP = {"argv": ["python", "-c", "import time; time.sleep(600)"], "env": {},
         "secret_env": {}, "workdir": None, "cpu": None, "memory": None}


def wrapper(**hello: Any) -> HostSession:
    """A host session whose 'ssh' is the wrapper itself, started here."""
    argv = [sys.executable, "-c", remote.LOADER, remote.HOST_MARK, "t"]
    session = HostSession(SSHHost("here"), argv,
                          {"action": "host", "executor_id": "t", "grace": 5.0, **hello})
    session.open("w0", 30)
    return session


def ended(worker: Remote, timeout: float = 30) -> WorkerStatus:
    done = threading.Event()
    worker.on_exit(lambda _status: done.set())
    assert done.wait(timeout), f"worker {worker.worker_id} was not reported gone"
    return worker.current()


def test_silence_ends_every_worker_of_the_host() -> None:
    session = wrapper(watchdog=1.0)  # and no pings
    workers = [session.spawn(f"w{i}", SLEEP, 30) for i in range(3)]
    procs = [psutil.Process(w.pid) for w in workers if w.pid is not None]
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert len(gone) == 3 and not alive
    for worker in workers:  # each reported with its own end: SIGTERM from the wrapper
        assert ended(worker) == WorkerStatus(WorkerState.EXITED, exit_code=-15)
    assert session.shutdown(30), "the wrapper did not leave after its workers"


def test_end_of_input_ends_every_worker_of_the_host() -> None:
    session = wrapper(watchdog=600.0)
    workers = [session.spawn(f"w{i}", SLEEP, 30) for i in range(3)]
    assert session.shutdown(30)  # closes the wrapper's stdin, as ssh's end would
    for worker in workers:
        assert ended(worker) == WorkerStatus(WorkerState.EXITED, exit_code=-15)
        assert worker.pid is not None and not psutil.pid_exists(worker.pid)


def test_one_workers_end_leaves_its_siblings_running() -> None:
    session = wrapper(watchdog=600.0)
    workers = [session.spawn(f"w{i}", SLEEP, 30) for i in range(3)]
    workers[0].stop(grace=5)
    assert ended(workers[0]).exit_code == -15
    assert [w.current().state for w in workers[1:]] == [WorkerState.RUNNING] * 2
    assert session.shutdown(30)


def test_a_ping_before_the_session_opens_does_not_precede_the_hello() -> None:
    # the backend's ping thread pings every session it knows, also one whose ssh has not
    # started yet: the wrapper must still read the hello (and its code) first
    argv = [sys.executable, "-c", remote.LOADER, remote.HOST_MARK, "t"]
    session = HostSession(SSHHost("here"), argv,
                          {"action": "host", "executor_id": "t", "grace": 5.0,
                           "watchdog": 600.0})
    session.ping()
    session.signal(0, "term")
    session.open("w0", 30)
    assert session.greeted and not session.ended
    worker = session.spawn("w0", SLEEP, 30)
    assert worker.pid is not None
    assert session.shutdown(30)
