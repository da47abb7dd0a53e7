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
    slow = ex.submit(tasks.sleep_return, 5, "late")
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
