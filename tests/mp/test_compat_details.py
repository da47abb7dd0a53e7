"""Details code written for the stdlib's `multiprocessing` meets: the errors it raises, what
its calls return, the public names its submodules have."""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

import pytest

from tests.mp import tasks
from tests.mp.compat import STARTS, mpm
from tests.support.threads import at_once

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)


def test_sending_what_cannot_be_pickled_raises_the_picklers_error(mpm: ModuleType) -> None:
    """`except TypeError` catches it, as with the stdlib (ours adds what was sent as a
    note); the pipe and the queue go on."""
    left, right = mpm.Pipe()
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        left.send(threading.Lock())
    left.send("after")
    assert right.recv() == "after"
    queue = mpm.SimpleQueue()
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        queue.put(threading.Lock())
    queue.put("after")
    assert queue.get() == "after"
    for end in (left, right):
        end.close()
    queue.close()


def test_a_map_async_over_nothing_is_done_without_calling_back(mpm: ModuleType) -> None:
    called: list[object] = []
    with mpm.Pool(1) as pool:
        result = pool.map_async(tasks.square, [], callback=called.append)
        assert result.get(timeout=60) == [] and result.successful()
        assert pool.apply(tasks.square, (3,)) == 9  # (a callback would have run by now)
    assert called == []


def test_joinable_queue_join_returns_none(mpm: ModuleType) -> None:
    queue = mpm.JoinableQueue()
    queue.put(1)
    assert queue.get(timeout=30) == 1
    queue.task_done()
    assert queue.join() is None
    queue.close()


def test_a_child_marking_more_tasks_done_than_items_is_told(mpm: ModuleType) -> None:
    queue, told = mpm.JoinableQueue(), mpm.Queue()
    queue.put(1)
    child = mpm.Process(target=tasks.done_twice, args=(queue, told))
    child.start()
    assert told.get(timeout=60) == "too many"
    child.join(60)
    assert child.exitcode == 0
    assert queue.join() is None  # its one mark counted, the second refused


def test_public_names_beyond_all_are_there(mpm: ModuleType) -> None:
    sharedctypes = importlib.import_module(f"{mpm.__name__}.sharedctypes")
    assert isinstance(mpm.Value("i", 1), sharedctypes.Synchronized)
    assert isinstance(mpm.Array("i", 3), sharedctypes.SynchronizedArray)
    assert isinstance(mpm.Array("c", b"ab"), sharedctypes.SynchronizedString)
    assert issubclass(sharedctypes.SynchronizedArray, sharedctypes.SynchronizedBase)
    pool = importlib.import_module(f"{mpm.__name__}.pool")
    assert (pool.INIT, pool.RUN, pool.CLOSE, pool.TERMINATE) == (
        "INIT", "RUN", "CLOSE", "TERMINATE")
    assert (mpm.SUBDEBUG, mpm.SUBWARNING) == (5, 25)


def test_join_thread_comes_after_close(mpm: ModuleType) -> None:
    queue = mpm.Queue()
    with pytest.raises(AssertionError, match="not closed"):
        queue.join_thread()
    queue.put(1)
    assert queue.get(timeout=30) == 1
    queue.close()
    queue.join_thread()


class _RebuiltBadly:
    """Pickles fine; rebuilding it raises the `ValueError` of ``int("not a number")``."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return int, ("not a number",)


def test_what_cannot_be_rebuilt_raises_the_unpicklers_own_error(mpm: ModuleType) -> None:
    """A received object whose rebuilding fails raises what rebuilding raised, and bytes
    that are no pickle raise `pickle.UnpicklingError`, as the stdlib's `recv` and `get` do:
    `except ValueError` (an exception class whose constructor takes other arguments, say)
    catches it. The pipe and the queue go on."""
    import pickle

    left, right = mpm.Pipe()
    left.send(_RebuiltBadly())
    with pytest.raises(ValueError, match="not a number"):
        right.recv()
    left.send_bytes(b"no pickle")
    with pytest.raises(pickle.UnpicklingError):
        right.recv()
    left.send("after")
    assert right.recv() == "after"
    for end in (left, right):
        end.close()
    for queue in (mpm.Queue(), mpm.SimpleQueue()):
        queue.put(_RebuiltBadly())
        with pytest.raises(ValueError, match="not a number"):
            queue.get()
        queue.put("after")
        assert queue.get() == "after"
        queue.close()


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_a_contexts_process_is_named_after_its_method(mpm: ModuleType, method: str) -> None:
    """``get_context("spawn").Process`` makes ``SpawnProcess-N``, the module's own
    ``Process`` ``Process-N``, as the stdlib's (code and logs that read the names see the
    same)."""
    kind = {"spawn": "SpawnProcess", "fork": "ForkProcess",
            "forkserver": "ForkServerProcess"}[method]
    ctx = mpm.get_context(method)
    proc = ctx.Process(target=tasks.square, args=(3,))
    assert proc.name.startswith(f"{kind}-") and type(proc).__name__ == kind
    assert mpm.Process(target=tasks.square, args=(3,)).name.startswith("Process-")
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def test_a_pool_and_its_results_are_the_stdlibs_kinds(mpm: ModuleType) -> None:
    """Libraries tell a pool from an executor by ``isinstance(pool,
    multiprocessing.pool.Pool)`` (dask's ``config.set(pool=...)``), and results by
    `AsyncResult`; a pool cannot be pickled, as the stdlib's says."""
    import multiprocessing.pool
    import pickle

    with mpm.Pool(1) as pool:
        assert isinstance(pool, multiprocessing.pool.Pool)
        applied = pool.apply_async(tasks.square, (3,))
        mapped = pool.map_async(tasks.square, [1, 2])
        lazy = pool.imap(tasks.square, [4], chunksize=1)
        assert isinstance(applied, multiprocessing.pool.AsyncResult)
        assert isinstance(mapped, multiprocessing.pool.MapResult)
        assert isinstance(lazy, multiprocessing.pool.IMapIterator)
        assert (applied.get(60), mapped.get(60), lazy.__next__(60)) == (9, [1, 4], 16)
        with pytest.raises(NotImplementedError, match="cannot be passed between processes"):
            pickle.dumps(pool)
        with pytest.raises(TypeError):
            pool.imap(tasks.square, [1], chunksize=None)


def test_results_waited_for_from_several_threads_each_come_back_to_their_caller(
        mpm: ModuleType) -> None:
    """Four threads share a pool, each waiting for its own calls in every way a result
    offers: `apply`, ``get`` on `apply_async`, a ``wait`` that times out before the call
    ends and one that does not, and a callback. Each outcome, value or error, comes back to
    the thread that asked; once ``get`` or ``wait`` returned with it, the result says it is
    ready and whether it succeeded; a callback has run before ``get`` returns."""
    import time

    def calls(pool: Any, k: int) -> None:
        for i in range(20):
            x = 100 * k + i
            if i % 4 == 0:
                with pytest.raises(ValueError, match=f"bad {x}"):
                    pool.apply(tasks.fail, (x,))
            elif i % 4 == 1:
                result = pool.apply_async(tasks.square, (x,))
                assert result.get(60) == x * x and result.ready() and result.successful()
            elif i % 4 == 2:
                slow = pool.apply_async(time.sleep, (0.2,))
                slow.wait(0.01)
                assert not slow.ready()
                slow.wait(60)
                assert slow.ready() and slow.successful() and slow.get(0) is None
            else:
                told: list[int] = []
                result = pool.apply_async(tasks.add, (x, 1), callback=told.append)
                assert result.get(60) == x + 1 and told == [x + 1]

    with mpm.Pool(2) as pool:
        at_once(calls, [(pool, k) for k in range(4)], timeout=90)


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("chunksize", [1, 2])
def test_imap_after_an_item_raises(mpm: ModuleType, chunksize: int, ordered: bool) -> None:
    """One task an item: the items after it still come. Chunks (``chunksize > 1``): the
    stdlib hands out a generator over them, which the error ends."""
    with mpm.Pool(1) as pool:
        imap = pool.imap if ordered else pool.imap_unordered
        results = imap(tasks.fail_on, range(8), chunksize=chunksize)
        got: list[object] = []
        while True:
            try:
                got.append(next(results))
            except StopIteration:
                break
            except ValueError as exc:
                got.append(str(exc))
    expected = [0, 1, 2, "bad 3", 4, 5, 6, 7] if chunksize == 1 else [0, 1, "bad 3"]
    assert got == expected


def test_a_process_dropped_without_close_gives_its_descriptors_back(mpm: ModuleType) -> None:
    """An RL loop that starts environments anew and never calls ``close()``: the stdlib's
    process objects close their sentinel when collected (ours held a pipe each until
    ``close()``, so such a loop ran out of descriptors)."""
    import gc
    import os

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    for _ in range(3):  # whatever the first start opens for good (the broker, a launcher)
        warm = mpm.Process(target=tasks.square, args=(1,))
        warm.start()
        warm.join(60)
    del warm
    gc.collect()
    before = open_fds()
    for _ in range(STARTS):  # a descriptor kept by each shows beyond the 2 allowed
        process = mpm.Process(target=tasks.square, args=(2,))
        process.start()
        process.join(60)
        assert process.exitcode == 0
    del process
    gc.collect()
    assert open_fds() <= before + 2
