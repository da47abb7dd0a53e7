"""How a pool's waits and ends behave, the same as the stdlib's."""

from __future__ import annotations

import multiprocessing
import time
from types import ModuleType

import pytest

from tests.mp import tasks
from tests.mp.compat import mpm

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("kind", ["imap", "imap_unordered"])
def test_an_imap_wait_that_times_out_raises_multiprocessings_timeout_error(
        mpm: ModuleType, kind: str) -> None:
    with mpm.Pool(1) as pool:
        results = getattr(pool, kind)(time.sleep, [30])
        with pytest.raises(multiprocessing.TimeoutError) as raised:
            results.next(timeout=0.05)
        assert isinstance(raised.value, mpm.TimeoutError)


def test_join_after_terminate_returns_though_an_imap_was_partly_read(mpm: ModuleType) -> None:
    """What a terminated pool had not submitted never runs: `join` does not submit it."""
    pool = mpm.Pool(2)
    results = pool.imap_unordered(tasks.square, range(100))
    assert next(results) in {i * i for i in range(100)}
    pool.terminate()
    pool.join()


def test_an_exception_that_cannot_be_sent_back_is_a_maybe_encoding_error(
        mpm: ModuleType) -> None:
    from tests.mp import compat_tasks as t

    with mpm.Pool(1) as pool:
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as unsent:
            pool.map(t.raise_holding_a_lock, [1])
        assert "cannot pickle '_thread.lock' object" in str(unsent.value)
        assert pool.map(abs, [-3]) == [3]  # the pool lives on


def _fails_after(n: int):  # type: ignore[no-untyped-def]
    yield from range(n)
    raise ValueError(f"the input failed after {n} items")


@pytest.mark.parametrize("n", [5, 200])
@pytest.mark.parametrize("kind", ["imap", "imap_unordered"])
def test_an_input_that_fails_midway_gives_every_result_before_its_error(
        mpm: ModuleType, kind: str, n: int) -> None:
    """(The standard library's ``imap_unordered`` may give one fewer: its error can
    overtake the last result. Ours gives them all; it once gave none of those in flight.)"""
    with mpm.Pool(2) as pool:
        results = getattr(pool, kind)(abs, _fails_after(n))
        got: list[int] = []
        with pytest.raises(ValueError, match=f"failed after {n} items"):
            got.extend(results)
    lost = 1 if kind == "imap_unordered" and mpm is multiprocessing else 0
    assert set(got) <= set(range(n)) and len(set(got)) == len(got) >= n - lost


def test_a_task_that_exits_fails_and_the_program_goes_on() -> None:
    """In the standard library's pool a task's SystemExit ends its worker and the task's
    result never comes (``get`` waits for ever); re-raised here it would end the program."""
    import fiberexec.multiprocessing as fmp
    from tests.mp import compat_tasks as t

    with fmp.Pool(1) as pool:
        with pytest.raises(fmp.ProcessError, match=r"the task raised SystemExit\(3\)") as info:
            pool.apply(t.exit_with, (3,))
        assert isinstance(info.value.__cause__, SystemExit)
        assert pool.apply(abs, (-2,)) == 2


@pytest.mark.parametrize("processes", ["2", 2.0])
def test_a_pool_size_that_is_not_a_whole_number_is_a_type_error(
        mpm: ModuleType, processes: object) -> None:
    with pytest.raises(TypeError):
        mpm.Pool(processes)


def test_a_manager_shut_down_is_not_started_again(mpm: ModuleType) -> None:
    manager = mpm.Manager()
    manager.shutdown()
    with pytest.raises(multiprocessing.ProcessError, match="Manager has shut down"):
        manager.start()
    with pytest.raises(multiprocessing.ProcessError, match="Manager has shut down"), manager:
        pass
