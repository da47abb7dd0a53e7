"""Silence is judged generously: a stopped executor keeps its workers; one gone for good does not.

A worker's death is noticed through its connection; silence matters only where a network can
be cut. So an executor stopped for 10 s (SIGSTOP, a starved machine) loses no worker and no
task when it continues, and a worker leaves only after ``silence_timeout`` of silence.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

PROGRAM = """
import sys, time
from fiberexec import FiberExecutor
ex = FiberExecutor(2, heartbeat=0.5, silence_timeout=float(sys.argv[1]))
futures = [ex.submit(time.sleep, float(sys.argv[2])) for _ in range(2)]
while not all(f.running() for f in futures):
    time.sleep(0.01)
print("running", flush=True)
sys.stdin.readline()  # the test says when to go on
for f in futures:
    f.result(timeout=120)
s = ex.stats()
print("done", s.workers_lost, s.tasks_retried, s.tasks_failed, flush=True)
ex.shutdown()
"""


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a stopped parent cannot reap its dead children)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start(silence: float, task: float) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    executor = subprocess.Popen([sys.executable, "-c", PROGRAM, str(silence), str(task)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    assert executor.stdout is not None
    assert executor.stdout.readline().strip() == "running"
    workers = [p for p in psutil.Process(executor.pid).children(recursive=True)
               if "--launcher" not in p.cmdline() or p.ppid() != executor.pid]  # not the launcher
    assert len(workers) == 2, "the executor should have two worker processes"
    return executor, workers


@pytest.mark.slow
def test_an_executor_stopped_for_ten_seconds_keeps_its_workers_and_tasks() -> None:
    executor, workers = _start(silence=30.0, task=2.0)
    try:
        os.kill(executor.pid, signal.SIGSTOP)
        time.sleep(10)  # the fault itself: the executor frozen for 10 s
        assert all(_alive(w) for w in workers), "a worker left its stopped executor"
        os.kill(executor.pid, signal.SIGCONT)
        out, _ = executor.communicate("go\n", timeout=60)
        assert out.split() == ["done", "0", "0", "0"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(executor.pid, signal.SIGKILL)
        executor.communicate(timeout=30)


def test_busy_workers_leave_an_executor_silent_beyond_silence_timeout() -> None:
    executor, workers = _start(silence=2.0, task=60.0)
    try:
        os.kill(executor.pid, signal.SIGSTOP)  # silent, connections still up
        deadline = time.monotonic() + 12  # 2 s of silence, with a wide margin
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)  # their parent is stopped: nothing here can be waited on
        assert not any(_alive(w) for w in workers), "a worker outlived its frozen executor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(executor.pid, signal.SIGKILL)
        executor.communicate(timeout=30)


def test_results_sent_before_workers_left_a_stalled_executor_count() -> None:
    """The tasks end while the executor is stopped; its workers, hearing nothing past
    silence_timeout, leave (saying why). Woken, the executor reads what they sent before
    it judges them: the results stand, and no task runs again or fails."""
    executor, workers = _start(silence=2.0, task=0.3)
    try:
        os.kill(executor.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 12
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)  # their parent is stopped: nothing here can be waited on
        assert not any(_alive(w) for w in workers), "the workers did not leave"
        os.kill(executor.pid, signal.SIGCONT)
        out, _ = executor.communicate("go\n", timeout=60)
        assert out.split() == ["done", "0", "0", "0"]  # none lost, retried or failed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(executor.pid, signal.SIGKILL)
        executor.communicate(timeout=30)


AT_MOST_ONCE = """
import sys, time
from fiberexec import FiberExecutor, WorkerLostError
ex = FiberExecutor(1, heartbeat=0.5, silence_timeout=2.0, max_task_retries=0)
future = ex.submit(time.sleep, 30)
while not future.running():
    time.sleep(0.01)
print("running", flush=True)
sys.stdin.readline()  # the test says when to go on
try:
    future.result(timeout=120)
    print("ran")
except WorkerLostError:
    print("lost")
print(ex.stats().tasks_retried, flush=True)
ex.shutdown()
"""


def test_a_task_whose_worker_left_a_stalled_executor_mid_run_is_not_run_again() -> None:
    """Leaving mid-task, a worker says nothing: the task is charged with the loss, and
    with max_task_retries=0 it fails rather than run a second time."""
    executor = subprocess.Popen([sys.executable, "-c", AT_MOST_ONCE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert executor.stdout is not None
        assert executor.stdout.readline().strip() == "running"
        (worker,) = [p for p in psutil.Process(executor.pid).children(recursive=True)
                     if "--launcher" not in p.cmdline()]
        os.kill(executor.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 12
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)  # its parent is stopped: nothing here can be waited on
        assert not _alive(worker), "the worker did not leave"
        os.kill(executor.pid, signal.SIGCONT)
        out, _ = executor.communicate("go\n", timeout=60)
        assert out.split() == ["lost", "0"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(executor.pid, signal.SIGKILL)
        executor.communicate(timeout=30)


def test_an_idle_worker_beats_a_quarter_silence_apart_and_a_busy_one_every_heartbeat() -> None:
    """A worker waiting for tasks says it is there at the keep-alive pace (a quarter of
    ``silence_timeout``, four within the silence the executor judges), so a thousand idle
    workers do not wake it a thousand times a second; one at work sends its CPU and memory
    use every ``heartbeat``."""
    from fiberexec import FiberExecutor
    from fiberexec import _protocol as p

    beat = len(p.encode(p.Heartbeat(12.5, 1 << 20)))  # every reading packs to one size
    with FiberExecutor(1, heartbeat=0.05, silence_timeout=2.0) as ex:
        ex.submit(int).result(timeout=60)
        before = ex.stats().bytes_received
        time.sleep(2.0)  # idle: at the keep-alive pace of 0.5 s, about four
        idle = (ex.stats().bytes_received - before) / beat
        before = ex.stats().bytes_received
        ex.submit(time.sleep, 1.0).result(timeout=60)  # at work: about twenty
        busy = (ex.stats().bytes_received - before) / beat
    assert idle <= 6, f"{idle:.1f} heartbeats' worth from an idle worker in 2 s"
    assert busy >= 10, f"{busy:.1f} heartbeats' worth from a worker at work for 1 s"
