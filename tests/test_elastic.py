"""Elastic for real: work a worker has not started moves to workers that join or free up.

The function is learned short from one instant task, then its tasks run long: the first
worker must not keep the backlog while the pool grows (nothing else knows the durations).
"""

from __future__ import annotations

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
