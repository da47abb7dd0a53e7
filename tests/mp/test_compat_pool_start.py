"""A pool's workers start with the pool, as the stdlib's do: each runs the initializer
even when no task ever comes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)


def test_the_initializer_runs_in_a_pool_closed_without_a_task(
        mpm: ModuleType, tmp_path: Path) -> None:
    pool = mpm.Pool(1, initializer=t.touch_unique, initargs=(str(tmp_path),))
    pool.close()
    pool.join()
    assert len(list(tmp_path.glob("init-*"))) == 1


def test_a_keyword_the_pool_does_not_take_fails_where_it_is_made(mpm: ModuleType) -> None:
    """A misspelt keyword is a `TypeError` from the constructor, naming it, not an error at
    the first task (fiberexec's pool takes more keywords than the stdlib's: its
    executor's, checked there too)."""
    with pytest.raises(TypeError, match="unexpected keyword argument.*initalizer"):
        mpm.Pool(1, initalizer=print)
    with pytest.raises(TypeError, match="unexpected keyword argument.*imgae"):
        mpm.get_context("spawn").Pool(1, imgae="me/app:1")
