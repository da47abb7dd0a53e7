"""A worker busy in a long task still leaves when its executor falls silent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

PROGRAM = """
import time
from fiberexec import FiberExecutor
ex = FiberExecutor(1, heartbeat=0.5)
future = ex.submit(time.sleep, 60)
while not future.running():
    time.sleep(0.01)
print("running", flush=True)
time.sleep(600)
"""


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a stopped parent cannot reap its dead children)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_busy_worker_exits_when_the_executor_is_frozen() -> None:
    executor = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        assert executor.stdout is not None
        assert executor.stdout.readline().strip() == "running"
        workers = psutil.Process(executor.pid).children(recursive=True)
        assert workers, "the executor has no worker process"
        os.kill(executor.pid, signal.SIGSTOP)  # silent, connection still up
        deadline = time.monotonic() + 10  # 3 heartbeats of 0.5 s, with a wide margin
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "the worker outlived its frozen executor"
    finally:
        os.killpg(executor.pid, signal.SIGKILL)
        executor.communicate(timeout=30)
