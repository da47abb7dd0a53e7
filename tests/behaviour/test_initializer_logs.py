"""What a failing initializer logs reaches the parent before the executor breaks, as with the
stdlib, whose worker exits (flushing its queues) before its pool sees it gone. Runs over both
executors. The log travels on a stdlib queue, as in CPython's test: where the workers cannot
reach this process's queues (containers, other hosts), the executor refuses it with the
documented error instead, and that is what is checked there."""

from __future__ import annotations

import logging
import queue as queue_module
from concurrent.futures import BrokenExecutor
from typing import Any

import pytest

from tests import tasks
from tests.behaviour.both import SPAWN, Make, make, sees_us
from tests.conftest import BACKEND, ExecutorFactory

__all__ = ["make"]
# each a fresh executor: before the fix, a record was lost now and then (a remote backend's
# executor takes seconds to start its worker)
ROUNDS = 5 if BACKEND == "local" else 2


def _drain(records: Any) -> list[str]:
    """What is in the queue right now, as CPython's test reads it: no waiting."""
    out: list[str] = []
    while True:
        try:
            record: logging.LogRecord = records.get_nowait()
        except queue_module.Empty:
            return out
        out.append(record.getMessage())


def test_what_a_failing_initializer_logs_arrives_before_the_break(
        make: Make, make_executor: ExecutorFactory) -> None:
    reaches = make is not make_executor or sees_us(make_executor)
    for round_ in range(ROUNDS if reaches else 1):
        records = SPAWN.Queue()
        ex = make(1, initializer=tasks.log_then_fail_init, initargs=(records,))
        with pytest.raises(BrokenExecutor) as broken:
            ex.submit(tasks.square, 2).result(timeout=60)
        logged = "\n".join(_drain(records))
        ex.shutdown()
        records.close()
        records.join_thread()
        if not reaches:
            assert "cannot see" in str(broken.value.__cause__)
            continue
        assert "initializer giving up" in logged, f"round {round_}: {logged!r}"
        assert "ValueError: error in initializer" in logged, f"round {round_}: {logged!r}"
