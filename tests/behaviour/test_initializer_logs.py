"""What a failing initializer logs reaches the parent before the executor breaks, as with the
stdlib, whose worker exits (flushing its queues) before its pool sees it gone. Runs over both
executors."""

from __future__ import annotations

import logging
import queue as queue_module
from concurrent.futures import BrokenExecutor
from typing import Any

import pytest

from tests import tasks
from tests.behaviour.both import SPAWN, Make, make

__all__ = ["make"]
ROUNDS = 5  # each a fresh executor: before the fix, a record was lost now and then


def _drain(records: Any) -> list[str]:
    """What is in the queue right now, as CPython's test reads it: no waiting."""
    out: list[str] = []
    while True:
        try:
            record: logging.LogRecord = records.get_nowait()
        except queue_module.Empty:
            return out
        out.append(record.getMessage())


def test_what_a_failing_initializer_logs_arrives_before_the_break(make: Make) -> None:
    for round_ in range(ROUNDS):
        records = SPAWN.Queue()
        ex = make(1, initializer=tasks.log_then_fail_init, initargs=(records,))
        with pytest.raises(BrokenExecutor):
            ex.submit(tasks.square, 2).result(timeout=60)
        logged = "\n".join(_drain(records))
        assert "initializer giving up" in logged, f"round {round_}: {logged!r}"
        assert "ValueError: error in initializer" in logged, f"round {round_}: {logged!r}"
        ex.shutdown()
        records.close()
        records.join_thread()
