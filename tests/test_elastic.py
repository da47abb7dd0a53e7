"""Elastic for real: work a worker has not started moves to workers that join or free up.

The function is learned short from one instant task, then its tasks run long: the first
worker must not keep the backlog while the pool grows (nothing else knows the durations).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter

from fiberexec import FiberExecutor
from tests import tasks


def test_a_growing_pool_shares_a_backlog_its_first_worker_took() -> None:
    with FiberExecutor(max_workers=4, min_workers=1) as ex:
        assert ex.submit(tasks.sleep_pid, 0).result(timeout=60)  # "short", says the estimate
        futures = [ex.submit(tasks.sleep_pid, 0.3) for _ in range(24)]
        peak = 0
        deadline = time.monotonic() + 120
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            peak = max(peak, sum(f.running() for f in futures))
            time.sleep(0.02)  # sampling what the futures say: nothing to wait on
        per_worker = Counter(f.result(timeout=0) for f in futures)
        stats = ex.stats()
    assert len(per_worker) == 4, per_worker  # every worker that joined got work
    assert max(per_worker.values()) <= 9, per_worker  # 6 each is fair; 24 on one was the bug
    assert peak <= 2 * 4 + 1, f"{peak} futures were running at once"
    assert stats.tasks_failed == 0 and stats.workers_lost == 0



class _Said(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle, self.seen = needle, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.seen.set()


def test_a_task_that_comes_while_the_last_worker_retires_starts_another() -> None:
    """A worker idle for ``idle_timeout`` retires; a task submitted while it leaves saw a
    full pool and started none, and the leaving one was not replaced: the task waited
    forever (and shutdown with it). The worker is stopped here so that it leaves only once
    the task has come; the task now starts a worker as it goes."""
    logger = logging.getLogger("fiberexec")
    said, level = _Said("retires: idle"), logger.level
    logger.addHandler(said)
    logger.setLevel(logging.DEBUG)
    try:
        with FiberExecutor(max_workers=1, min_workers=0, idle_timeout=0.2) as ex:
            pid = ex.submit(tasks.sleep_pid, 0).result(timeout=60)
            os.kill(pid, signal.SIGSTOP)  # it will hear that it retires only when resumed
            try:
                assert said.seen.wait(60)
                late = ex.submit(tasks.square, 3)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert late.result(timeout=60) == 9
            stats = ex.stats()
        assert stats.tasks_failed == 0 and stats.workers_lost == 0
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)


def test_an_executor_waiting_on_a_backlog_of_long_tasks_keeps_off_the_cpu() -> None:
    """Its threads sleep until a worker answers: 8 workers, a warm-up that leaves them
    idle, then 160 tasks of 50 ms, one by one (its shard once polled without a timeout
    through all of it, a whole core, 6 ms of CPU a task against the stdlib's 0.1)."""
    with FiberExecutor(8, min_workers=8) as ex:
        for f in [ex.submit(tasks.sleep_pid, 0.05) for _ in range(32)]:
            f.result(timeout=60)
        began, cpu = time.monotonic(), time.process_time()
        futures = [ex.submit(tasks.sleep_pid, 0.05) for _ in range(160)]
        for f in futures:
            f.result(timeout=60)
        cpu, wall = time.process_time() - cpu, time.monotonic() - began
    assert cpu < 0.4 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s waiting on sleeping tasks"
