"""Lost workers are replaced at a bounded pace: a crash loop does not become a start storm,
and every task still ends (here: each fails with the loss that ended it)."""

from __future__ import annotations

import logging

import pytest

from fiberexec import FiberExecutor, WorkerLostError
from fiberexec._pace import Pace
from tests import tasks
from tests.conftest import ExecutorFactory


def test_a_crash_loop_is_replaced_at_a_pace_and_every_task_ends(
    make_executor: ExecutorFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    # Four workers dying as fast as they start lose twice a bucket's worth (8 starts,
    # refilled over 10 s) within seconds.
    burst = Pace.for_pool(4).burst
    ex: FiberExecutor = make_executor(4, max_task_retries=0)
    with caplog.at_level(logging.DEBUG, logger="fiberexec"):
        futures = [ex.submit(tasks.kill_self) for _ in range(2 * burst)]
        for future in futures:  # one worker lost per task
            with pytest.raises(WorkerLostError):
                future.result(timeout=120)
    paced = [r for r in caplog.records if "being lost faster than" in r.getMessage()]
    assert paced and paced[0].levelno == logging.WARNING  # said once, loudly
    assert all(r.levelno == logging.DEBUG for r in paced[1:])
    assert ex.submit(tasks.add, 1, 2).result(timeout=120) == 3  # and it carries on
