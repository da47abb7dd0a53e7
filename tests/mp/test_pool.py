"""Pool against the documented behaviour of multiprocessing.Pool."""

from __future__ import annotations

import itertools
import multiprocessing.pool
import threading
import time

import pytest

import fiberexec.multiprocessing as mp
from fiberexec import BrokenFiberExecutor, WorkerLostError
from fiberexec.multiprocessing._pool import IMAP_AHEAD
from tests.mp import tasks


def test_map_apply_starmap_match_builtins() -> None:
    with mp.Pool(2) as pool:
        assert pool.map(tasks.square, range(20)) == [x * x for x in range(20)]
        assert pool.map(tasks.square, range(20), chunksize=7) == [x * x for x in range(20)]
        assert pool.apply(tasks.add, (2, 3)) == 5
        assert pool.apply(tasks.add, (2,), {"b": 5}) == 7
        assert pool.starmap(tasks.add, [(1, 2), (3, 4)], chunksize=1) == [3, 7]
        assert pool.map(tasks.square, []) == []


def test_async_results_callbacks_and_errors() -> None:
    got: list[object] = []
    done = threading.Event()
    with mp.Pool(2) as pool:
        ok = pool.apply_async(tasks.square, (4,), callback=got.append)
        bad = pool.apply_async(tasks.fail, (1,), error_callback=lambda e: done.set())
        assert ok.get(timeout=60) == 16 and got == [16]
        assert ok.ready() and ok.successful()
        with pytest.raises(ValueError, match="bad 1"):
            bad.get(timeout=60)
        assert done.wait(10) and not bad.successful()
        mapped = pool.map_async(tasks.square, range(5), callback=got.append)
        assert mapped.get(60) == [0, 1, 4, 9, 16] and got[-1] == [0, 1, 4, 9, 16]
        starred = pool.starmap_async(tasks.add, [(1, 1)])
        starred.wait(60)
        assert starred.get() == [2]
        failing = pool.map_async(tasks.fail, range(4), chunksize=1)
        with pytest.raises(ValueError):
            failing.get(60)


def test_a_callback_that_raises_is_reported_as_a_threads_death_and_the_pool_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stdlib's result thread dies of it: `threading.excepthook` prints the traceback
    on stderr (and that pool then hangs). Here it is reported the same way, and the pool
    goes on."""
    reported: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))

    def explode(_: object) -> None:
        raise RuntimeError("callback exploded")

    with mp.Pool(1) as pool:
        result = pool.apply_async(tasks.square, (3,), callback=explode)
        assert result.get(timeout=60) == 9 and result.successful()
        assert pool.apply(tasks.square, (4,)) == 16
    assert [str(exc) for exc in reported] == ["callback exploded"]


def test_not_ready_and_timeout() -> None:
    with mp.Pool(1) as pool:
        slow = pool.apply_async(time.sleep, (5,))
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        with pytest.raises(mp.TimeoutError):
            slow.get(timeout=0.05)


def test_imap_is_lazy_with_an_endless_input() -> None:
    pulled = itertools.count()

    def endless() -> object:
        for i in itertools.count():
            next(pulled)
            yield i

    with mp.Pool(2) as pool:
        it = pool.imap(tasks.square, endless())
        assert [next(it) for _ in range(50)] == [i * i for i in range(50)]
        assert next(pulled) <= 50 + IMAP_AHEAD + 1  # only the in-flight window was read ahead
        unordered = pool.imap_unordered(tasks.square, range(30), chunksize=4)
        assert sorted(unordered) == sorted(i * i for i in range(30))


def test_imap_raises_at_the_failing_item_and_continues() -> None:
    with mp.Pool(2) as pool:
        it = pool.imap(tasks.square, [1, "x", 3])
        assert next(it) == 1
        with pytest.raises(TypeError):
            next(it)
        assert next(it) == 9
        with pytest.raises(StopIteration):
            next(it)


def test_initializer_runs_in_each_worker() -> None:
    with mp.Pool(2, initializer=tasks.count_init, initargs=("yes",)) as pool:
        assert set(pool.map(tasks.read_init, range(8))) == {"yes"}


def test_maxtasksperchild_replaces_workers() -> None:
    with mp.Pool(1, maxtasksperchild=1) as pool:  # worker ids: pids repeat across containers
        workers = {pool.apply(tasks.worker_id) for _ in range(3)}
    assert len(workers) == 3


def test_worker_killed_during_map_raises_not_hangs() -> None:
    with mp.Pool(2, max_task_retries=0) as pool:
        killed = pool.starmap_async(tasks.kill_self_on, [(i, 3) for i in range(6)], chunksize=1)
        with pytest.raises(WorkerLostError):
            killed.get(60)


def test_unpicklable_result_raises() -> None:
    with mp.Pool(1) as pool:
        with pytest.raises(multiprocessing.pool.MaybeEncodingError):
            pool.apply(tasks.unpicklable)
        assert pool.apply(tasks.square, (3,)) == 9  # the pool lives on


def test_close_join_and_state_errors() -> None:
    pool = mp.Pool(2)
    results = pool.map_async(tasks.square, range(10))
    with pytest.raises(ValueError, match="still running"):
        pool.join()
    pool.close()
    with pytest.raises(ValueError, match="not running"):
        pool.apply(tasks.square, (1,))
    pool.join()
    assert results.get(0) == [x * x for x in range(10)]


def test_terminate_stops_running_tasks_quickly() -> None:
    pool = mp.Pool(1)
    stuck = pool.apply_async(tasks.sleep_forever)
    queued = pool.apply_async(tasks.square, (1,))
    stuck.wait(0.5)  # it has had time to start; it never finishes by itself
    assert not stuck.ready()
    start = time.monotonic()
    pool.terminate()
    assert time.monotonic() - start < 30
    for result in (stuck, queued):  # neither hangs: both raise
        with pytest.raises((BrokenFiberExecutor, mp.ProcessError)):
            result.get(timeout=30)


def test_bad_arguments_name_the_rule() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        mp.Pool(0)
    with pytest.raises(ValueError, match="maxtasksperchild"):
        mp.Pool(1, maxtasksperchild=0)
    with pytest.raises(TypeError, match="initializer"):
        mp.Pool(1, initializer=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_buffersize_reads_lazily_and_validates(method: str) -> None:
    with mp.Pool(2) as pool:
        fetch = getattr(pool, method)
        with pytest.raises(TypeError, match="buffersize must be an integer or None"):
            fetch(abs, [1], buffersize=1.5)
        with pytest.raises(ValueError, match="buffersize must be None or > 0"):
            fetch(abs, [1], buffersize=0)
        consumed = itertools.count()
        source = (next(consumed) for _ in itertools.count())  # endless
        results = fetch(abs, source, buffersize=3)
        got = [results.next(timeout=60) for _ in range(10)]
        if method == "imap":
            assert got == list(range(10))
        else:  # finishing order: any 10 of what was read
            assert len(set(got)) == 10 and max(got) < 10 + 3
        assert next(consumed) <= 10 + 3 + 1  # at most the buffer read ahead
        pool.terminate()
