"""A shutdown lets every worker that began its initializer finish it, as the stdlib's
workers do: cutting one short would leave its effects half done (a lock it held, a file
half written). Runs over both executors."""

from __future__ import annotations

from pathlib import Path

from tests import tasks
from tests.behaviour.both import Make, make

__all__ = ["make"]


def test_shutdown_waits_for_initializers_already_running(make: Make, tmp_path: Path) -> None:
    # the first worker's initializer returns at once and runs the task; any other worker's
    # takes 2 s, so the shutdown comes while it runs
    ex = make(2, initializer=tasks.slow_unless_first, initargs=(str(tmp_path), 2.0))
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    ex.shutdown(wait=True)
    begun = sorted(p.name.removeprefix("begun-") for p in tmp_path.glob("begun-*"))
    done = sorted(p.name.removeprefix("done-") for p in tmp_path.glob("done-*"))
    assert begun and done == begun
