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
