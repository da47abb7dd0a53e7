"""``fiberexec.TimeoutError`` catches every timeout fiberexec and its futures raise."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time

import pytest

import fiberexec
import fiberexec.multiprocessing as mp
from tests import tasks
from tests.conftest import ExecutorFactory


def test_top_level_timeout_error_catches_future_result_timeout(
    make_executor: ExecutorFactory,
) -> None:
    ex = make_executor(1)
    slow = ex.submit(tasks.sleep_return, 1.5, "late")  # (the shutdown waits for it)
    with pytest.raises(fiberexec.TimeoutError) as info:
        slow.result(timeout=0.05)
    assert type(info.value) is concurrent.futures.TimeoutError  # the stdlib's own
    slow.cancel()


def test_pool_timeout_is_both_multiprocessing_and_builtin() -> None:
    with mp.Pool(1) as pool:
        slow = pool.apply_async(time.sleep, (5,))
        with pytest.raises(fiberexec.TimeoutError) as info:
            slow.get(timeout=0.05)
    assert isinstance(info.value, multiprocessing.TimeoutError)  # code written for the stdlib
    assert isinstance(info.value, mp.TimeoutError)
    assert fiberexec.TimeoutError is TimeoutError is concurrent.futures.TimeoutError


def test_a_map_timeout_is_raised_on_time_while_a_worker_cannot_answer(
        make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks ``map`` will not return are cancelled without waiting for the worker that
    holds them (as the stdlib's map cancels: at once), though its task keeps the worker's
    interpreter lock and nothing there can answer until it ends."""
    monkeypatch.setattr("fiberexec._shard.CANCEL_WAIT", 60.0)  # a wait would show
    ex = make_executor(1)
    for f in [ex.submit(tasks.backtrack, 1) for _ in range(50)]:  # known short: tasks are
        f.result(timeout=60)  # sent ahead to wait behind the running one
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        list(ex.map(tasks.backtrack, [27] * 6, timeout=0.3))  # each holds it seconds
    assert time.monotonic() - start < 2.0  # not until the running one ends
    ex.terminate()  # the running task would hold the worker for seconds more
