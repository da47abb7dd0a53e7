"""When ``shutdown(wait=True)`` returns, every future is done: a task that crashed its worker
has been retried to its limit or failed with the loss's cause, never left waiting for a
replacement that nobody runs. Runs over both executors."""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool

import pytest

from tests import tasks
from tests.behaviour.both import Make, make
from tests.conftest import BACKEND

__all__ = ["make"]
# Each round is a fresh executor; before the fix, most rounds hung. Where a round starts
# containers, pods or jobs, four are enough to catch that.
ROUNDS = 12 if BACKEND == "local" else 4


@pytest.mark.slow
def test_shutdown_after_a_crash_leaves_no_future_pending(make: Make) -> None:
    for round_ in range(ROUNDS):
        ex = make(2)
        future = ex.submit(tasks.segfault_after, 0.1)
        ex.shutdown(wait=True)
        assert future.done(), f"round {round_}: shutdown returned with the future pending"
        with pytest.raises(BrokenProcessPool):
            future.result(timeout=0)
