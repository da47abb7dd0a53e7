"""When ``shutdown(wait=True)`` returns, every future is done: a task that crashed its worker
has been retried to its limit or failed with the loss's cause, never left waiting for a
replacement that nobody runs. Runs over both executors."""

from __future__ import annotations

import re
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


def test_what_tasks_printed_is_out_once_shutdown_returns(
        make: Make, capfd: pytest.CaptureFixture[str]) -> None:
    """A task's prints reach the program's output by the time ``shutdown`` returns, even
    when it is called the moment the results are in: nothing is lost to the workers'
    stopping (their output may be block-buffered: it is a file here)."""
    for round_ in range(ROUNDS):
        ex = make(2)
        tags = [f"r{round_}t{i}" for i in range(6)]
        futures = [ex.submit(tasks.tagged_lines, tag, 40) for tag in tags]
        assert [f.result(timeout=60) for f in futures] == tags
        ex.shutdown(wait=True)
        out = capfd.readouterr().out
        # Two workers' writes may interleave within a line (an unbuffered stream writes a
        # line's text and its end apart): each task's lines are found, wherever they are.
        missing = [tag for tag in tags
                   if len(re.findall(rf"{tag} line (?:0|39)(?!\d)", out)) != 2]
        assert not missing, f"round {round_}: output missing from {missing}"
