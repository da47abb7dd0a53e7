"""Large arguments reach each worker once (``arg_cache``), with the stdlib's semantics: every
task sees the argument as it was when submitted, and owns its copy."""

from __future__ import annotations

import pytest

from tests import tasks
from tests.behaviour.both import Make, make
from tests.conftest import ExecutorFactory

np = pytest.importorskip("numpy")

__all__ = ["make"]  # the fixture a test of shared behaviour takes


def test_a_shared_argument_is_sent_once_per_worker_and_never_stale(
    make_executor: ExecutorFactory,
) -> None:
    ex = make_executor(1)
    theta = np.ones(1 << 18)  # 2 MiB: over the cache's threshold
    for _ in range(3):
        futures = [ex.submit(tasks.sum_then_scribble, theta) for _task in range(6)]
        # Each task saw theta as submitted, although the one before it changed its own copy.
        assert [f.result(timeout=60) for f in futures] == [float(theta.sum())] * 6
        theta *= 2.0  # the same object, new content: the next generation must see it
    stats = ex.stats()
    assert stats.args_kept_bytes == 3 * theta.nbytes  # once per generation to the one worker
    # each later task went without it; one taken back from a busy worker and sent again
    # (a machine under load) went without it twice
    assert stats.args_saved_bytes >= 3 * 5 * theta.nbytes
    assert stats.args_saved_bytes % theta.nbytes == 0


def test_the_cache_can_be_turned_off(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, arg_cache=0)
    theta = np.ones(1 << 18)
    assert [ex.submit(tasks.sum_then_scribble, theta).result(timeout=60) for _ in range(3)] == [
        float(theta.sum())] * 3
    assert ex.stats().args_saved_bytes == 0 and ex.stats().args_kept_bytes == 0


def test_each_task_owns_its_arguments_and_a_result_held_is_never_written_again(
        make: Make) -> None:
    ex = make(1)
    theta = np.ones(1 << 18)  # 2 MiB: kept by the worker, results through shared memory
    futures = [ex.submit(tasks.sum_then_scribble, theta) for _task in range(6)]
    assert [f.result(timeout=60) for f in futures] == [float(theta.sum())] * 6
    assert float(theta.sum()) == theta.size  # the caller's own array is untouched
    for _round in range(2):  # more results held than a sender keeps files; then let go
        held = [ex.submit(tasks.negate_inplace, theta * k).result(timeout=60)
                for k in range(1, 7)]
        assert [float(array.sum()) for array in held] == [-k * theta.size for k in range(1, 7)]
        del held

