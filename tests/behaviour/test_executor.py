"""The executor contract: the standard library's semantics, on every backend."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fiberexec import BrokenFiberExecutor, ConfigurationError, FiberExecutor
from tests import tasks
from tests.behaviour.both import Make, make
from tests.conftest import ExecutorFactory
from tests.support.threads import at_once

__all__ = ["make"]


def test_submit_returns_stdlib_future(executor: FiberExecutor) -> None:
    future = executor.submit(tasks.add, 2, b=3)
    assert isinstance(future, cf.Future)
    assert future.result(timeout=30) == 5


def test_as_completed_and_wait_work_unchanged(executor: FiberExecutor) -> None:
    futures = [executor.submit(tasks.square, i) for i in range(50)]
    assert sorted(f.result() for f in cf.as_completed(futures, timeout=30)) == [
        i * i for i in range(50)
    ]
    done, not_done = cf.wait(futures, timeout=30, return_when=cf.ALL_COMPLETED)
    assert len(done) == 50 and not not_done


def test_map_preserves_order_with_chunks(executor: FiberExecutor) -> None:
    for chunksize in (1, 3, 100):
        assert list(executor.map(tasks.add, range(40), range(40), chunksize=chunksize)) == [
            2 * i for i in range(40)
        ]


def test_map_over_uneven_iterables_stops_at_shortest(executor: FiberExecutor) -> None:
    assert list(executor.map(tasks.add, [1, 2, 3], [10, 20])) == [11, 22]


def test_map_rejects_bad_chunksize(executor: FiberExecutor) -> None:
    with pytest.raises(ValueError, match="chunksize must be >= 1"):
        executor.map(tasks.square, [1], chunksize=0)


def test_a_task_raising_stopiteration_in_a_map_fails_it_and_loses_nothing_silently(
        make: Make) -> None:
    """A chunk run as ``list(map(...))`` ended at the StopIteration: the rest of its items
    went missing and the results no longer lined up with the inputs."""
    ex = make(2)
    for chunksize in (1, 3):
        for fn, iterables in ((tasks.stop_at_three, 1), (tasks.add_unless_three, 2)):
            with pytest.raises(RuntimeError, match="generator raised StopIteration"):
                list(ex.map(fn, *[range(8)] * iterables, chunksize=chunksize))


def test_map_refuses_a_chunksize_that_is_not_a_whole_number(make: Make) -> None:
    ex = make(1)
    with pytest.raises(ValueError):
        list(ex.map(tasks.square, range(4), chunksize=2.5))
    for not_a_number in ("2", None):  # as the stdlib's comparison with 1 raises
        with pytest.raises(TypeError):
            list(ex.map(tasks.square, range(4), chunksize=not_a_number))  # type: ignore[arg-type]


def test_map_over_arguments_that_raise_midway_runs_those_before(
        make: Make, tmp_path: Path) -> None:
    """The stdlib's map submits as it reads: what came before the error is submitted and
    runs, and map raises the iterator's error (ours hands the calls over together)."""
    def paths() -> Any:
        for i in range(3):
            yield str(tmp_path / str(i))
        raise LookupError("the third argument was the last")

    ex = make(2)
    with pytest.raises(LookupError, match="the third argument"):
        ex.map(tasks.mark, paths())
    ex.shutdown(wait=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]


def test_map_timeout_raises_timeout_error(executor: FiberExecutor) -> None:
    results = executor.map(tasks.sleep_return, [1.5], timeout=0.2)  # (shutdown waits)
    with pytest.raises(TimeoutError):
        list(results)


def test_map_raises_the_first_task_exception_when_reached(executor: FiberExecutor) -> None:
    results = executor.map(tasks.raise_value_error, ["first"], chunksize=2)
    with pytest.raises(ValueError, match="first"):
        list(results)


def test_lambdas_and_closures_travel(executor: FiberExecutor) -> None:
    offset = 10
    assert executor.submit(lambda x: x + offset, 5).result(timeout=30) == 15


def test_submit_after_shutdown_uses_stdlib_message(executor: FiberExecutor) -> None:
    executor.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        executor.submit(tasks.square, 1)


def test_repr_says_what_it_is_and_how_it_stands(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    name = repr(ex).split("backend=", 1)[1].split()[0]  # the backend under test's
    assert repr(ex) == f"<FiberExecutor max_workers=2 backend={name} not started>"
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    assert repr(ex) == f"<FiberExecutor max_workers=2 backend={name} running>"
    ex.shutdown()
    assert repr(ex) == f"<FiberExecutor max_workers=2 backend={name} shut down>"


def test_shutdown_without_use_starts_nothing() -> None:
    ex = FiberExecutor(2)
    ex.shutdown()
    assert ex.stats().workers == 0


def test_context_manager_waits_for_work(make_executor: ExecutorFactory) -> None:
    with make_executor(2) as ex:
        futures = [ex.submit(tasks.sleep_return, 0.05, i) for i in range(6)]
    assert [f.result(timeout=0) for f in futures] == list(range(6))


def test_shutdown_cancel_futures_cancels_queued(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    futures = [ex.submit(tasks.sleep_return, 0.2, i) for i in range(20)]
    futures[0].result(timeout=30)
    ex.shutdown(wait=True, cancel_futures=True)
    cancelled = [f for f in futures if f.cancelled()]
    finished = [f for f in futures if not f.cancelled()]
    assert cancelled, "queued futures should have been cancelled"
    assert all(f.done() and f.exception() is None for f in finished)


def test_shutdown_no_wait_still_finishes_submitted_work(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    futures = [ex.submit(tasks.sleep_return, 0.05, i) for i in range(4)]
    ex.shutdown(wait=False)
    assert [f.result(timeout=30) for f in futures] == list(range(4))


def test_cancel_before_dispatch(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    blocker = ex.submit(tasks.sleep_return, 0.5, "done")
    queued = [ex.submit(tasks.square, i) for i in range(200)]
    assert queued[-1].cancel()
    assert blocker.result(timeout=30) == "done"
    assert queued[-1].cancelled()
    assert [f.result(timeout=30) for f in queued[:-1]] == [i * i for i in range(199)]


@pytest.mark.parametrize("cls", [cf.ProcessPoolExecutor, FiberExecutor])
@pytest.mark.parametrize("bad", [0, -1])
def test_max_workers_must_be_positive(cls: type[cf.Executor], bad: int) -> None:
    # CPython's exact words first (tests written for the stdlib match on them)
    with pytest.raises(ValueError, match="^max_workers must be greater than 0"):
        cls(bad)  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [cf.ProcessPoolExecutor, FiberExecutor])
def test_initializer_must_be_callable(cls: type[cf.Executor]) -> None:
    with pytest.raises(TypeError, match="^initializer must be a callable"):
        cls(1, initializer=5)  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [cf.ProcessPoolExecutor, FiberExecutor])
def test_initializer_and_initargs_pass_by_position(cls: type[cf.Executor],
                                                   tmp_path: Path) -> None:
    """``(max_workers, mp_context, initializer, initargs)``, the stdlib's signature."""
    record = tmp_path / "init.txt"
    with cls(1, None, tasks.record_pid, (str(record),)) as ex:  # type: ignore[call-arg]
        pid = ex.submit(tasks.pid).result(timeout=60)
    assert record.read_text().split() == [str(pid)]  # the one worker ran it, with that path


def test_bad_options_name_rule_and_value() -> None:
    with pytest.raises(ConfigurationError, match="min_workers must be between 0 and max_workers=2"):
        FiberExecutor(2, min_workers=5)
    with pytest.raises(ConfigurationError, match="max_tasks_per_child must be >= 1"):
        FiberExecutor(2, max_tasks_per_child=0)
    with pytest.raises(ConfigurationError, match="memory must be bytes > 0 or a quantity"):
        FiberExecutor(2, memory="lots")
    with pytest.raises(ConfigurationError, match=r"unknown backend 'nope' \(from the backend= "
                       r"argument\); known backends: "):
        FiberExecutor(2, backend="nope")  # at construction, not at the first submit


def test_initializer_runs_once_per_worker(
    make_executor: ExecutorFactory, tmp_path: Path, log_event: Callable[[str, int], threading.Event]
) -> None:
    record = tmp_path / "init.txt"
    connected = log_event("connected", 2)
    ex = make_executor(2, initializer=tasks.record_init, initargs=(str(record),))
    ex.submit(tasks.square, 1).result(timeout=60)
    assert connected.wait(timeout=60)
    workers = {f.result(timeout=30) for f in [ex.submit(tasks.worker_id) for _ in range(40)]}
    ex.shutdown()
    started = set(record.read_text().split())
    assert workers <= started and len(started) == 2


def test_failing_initializer_breaks_executor(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, initializer=tasks.fail_init)
    future = ex.submit(tasks.square, 3)
    with pytest.raises(BrokenFiberExecutor, match="initializer failed") as info:
        future.result(timeout=30)
    assert isinstance(info.value, cf.BrokenExecutor)
    assert "initializer refused" in repr(info.value.__cause__)
    with pytest.raises(BrokenFiberExecutor):
        ex.submit(tasks.square, 3)


def test_an_initializer_that_ends_its_process_breaks_the_executor(make: Make) -> None:
    """Every worker's initializer would end it the same way: the executor breaks, naming
    the initializer, and no task is retried on worker after worker."""
    ex = make(1, initializer=tasks.exit_now, initargs=(4,))
    future = ex.submit(tasks.square, 3)
    with pytest.raises(BrokenProcessPool) as info:
        future.result(timeout=60)
    if isinstance(ex, FiberExecutor):
        assert "initializer" in str(info.value) and "code 4" in str(info.value)
        assert ex.stats().tasks_retried == 0
    with pytest.raises(BrokenProcessPool):
        ex.submit(tasks.square, 3)


def test_max_tasks_per_child_replaces_workers(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, max_tasks_per_child=3)
    ids = [f.result(timeout=60) for f in [ex.submit(tasks.worker_id) for _ in range(9)]]
    assert len(set(ids)) == 3
    assert all(ids.count(i) == 3 for i in set(ids))


def test_min_workers_scale_up_on_backlog(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, min_workers=0)
    assert ex.stats().workers == 0
    futures = [ex.submit(tasks.sleep_return, 0.2, i) for i in range(4)]
    assert [f.result(timeout=60) for f in futures] == list(range(4))
    assert ex.stats().workers + ex.stats().workers_starting == 2


def test_idle_workers_scale_down_to_min(
    make_executor: ExecutorFactory, log_event: Callable[[str, int], threading.Event]
) -> None:
    left = log_event("left: idle", 1)
    ex = make_executor(2, min_workers=1, idle_timeout=0.3)
    futures = [ex.submit(tasks.sleep_return, 0.3, i) for i in range(4)]
    assert [f.result(timeout=60) for f in futures] == list(range(4))
    assert left.wait(timeout=30), "no idle worker left"
    stats = ex.stats()
    assert stats.workers + stats.workers_starting == 1
    assert ex.submit(tasks.square, 4).result(timeout=30) == 16


def test_stats_count_tasks(executor: FiberExecutor) -> None:
    for f in [executor.submit(tasks.square, i) for i in range(10)]:
        f.result(timeout=30)
    with pytest.raises(ValueError):
        executor.submit(tasks.raise_value_error, "x").result(timeout=30)
    stats = executor.stats()
    assert stats.tasks_done == 10 and stats.tasks_failed == 1
    assert stats.workers + stats.workers_starting == 2
    assert stats.tasks_pending == 0 and stats.tasks_running == 0
    assert stats.throughput > 0


def test_stats_count_map_items_not_chunks(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    assert list(ex.map(tasks.square, range(96), chunksize=8, timeout=60)) == [
        i * i for i in range(96)]
    with pytest.raises(ValueError):
        list(ex.map(tasks.raise_value_error, ["x"] * 4, chunksize=4, timeout=60))
    stats = ex.stats()
    assert (stats.tasks_done, stats.tasks_failed, stats.tasks_submitted) == (96, 4, 100)


def test_stats_count_every_task_submitted_cancelled_ones_too(
        make_executor: ExecutorFactory) -> None:
    """What was submitted never goes down (a Prometheus counter is made of it)."""
    ex = make_executor(1)
    first = ex.submit(tasks.sleep_return, 1.0)
    queued = [ex.submit(tasks.square, i) for i in range(10)]
    assert ex.stats().tasks_submitted == 11
    assert sum(f.cancel() for f in queued) >= 8  # all but what the worker may have started
    first.result(timeout=60)
    cf.wait(queued, timeout=60)
    stats = ex.stats()
    assert stats.tasks_submitted == 11
    assert stats.tasks_done == 1 + sum(not f.cancelled() for f in queued)


def test_stats_count_the_bytes_over_the_links(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert (ex.stats().bytes_sent, ex.stats().bytes_received) == (0, 0)
    blob = bytes(range(256)) * 1000  # 256 kB: inline, under the shared-memory threshold
    assert ex.submit(tasks.identity, blob).result(timeout=60) == blob
    after_one = ex.stats()
    assert after_one.bytes_sent > len(blob) and after_one.bytes_received > len(blob)
    assert ex.submit(tasks.identity, b"").result(timeout=60) == b""
    after_two = ex.stats()
    assert after_one.bytes_sent < after_two.bytes_sent < after_one.bytes_sent + len(blob)


def test_progress_hook_sees_completion(make_executor: ExecutorFactory) -> None:
    seen = []
    ex = make_executor(2, progress=seen.append)
    for f in [ex.submit(tasks.square, i) for i in range(20)]:
        f.result(timeout=30)
    ex.shutdown()
    assert seen and seen[-1].tasks_done == 20


def test_idle_shard_steals_from_busy_shard(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, shards=2)  # one worker per shard; tasks alternate between shards
    seconds = [0.05 if i % 2 == 0 else 0.0 for i in range(60)]
    assert list(ex.map(tasks.sleep_return, seconds, range(60), timeout=120)) == list(range(60))
    stats = ex.stats()
    assert stats.tasks_stolen > 0, "the idle shard never took work from the busy one"
    assert stats.tasks_done == 60


def test_terminate_kills_running_tasks_and_fails_the_rest(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    running = [ex.submit(tasks.sleep_return, 60, i) for i in range(2)]
    queued = [ex.submit(tasks.square, i) for i in range(5)]
    assert ex.submit(tasks.square, 0)  # still accepting before terminate
    for f in running:
        with pytest.raises(TimeoutError):
            f.result(timeout=0.5)  # they are really running
    ex.terminate()
    for f in running + queued:
        assert f.done()
        assert f.cancelled() or isinstance(f.exception(), BrokenFiberExecutor)
    with pytest.raises(BrokenFiberExecutor, match="terminated"):
        ex.submit(tasks.square, 1)


def test_shutdown_waiting_from_a_done_callback_raises_and_shuts_down(make: Make) -> None:
    """A callback runs on the executor's own thread: a `shutdown(wait=True)` there would
    wait for itself. The stdlib raises `RuntimeError` ("cannot join current thread"), after
    shutting down; so does ours."""
    ex = make(1)
    said: list[BaseException | None] = []
    called = threading.Event()

    def callback(_: object) -> None:
        try:
            ex.shutdown(wait=True)
            said.append(None)
        except BaseException as exc:  # what it raised, whatever it was
            said.append(exc)
        called.set()

    ex.submit(tasks.square, 3).add_done_callback(callback)
    assert called.wait(60)
    assert isinstance(said[0], RuntimeError) and "cannot join current thread" in str(said[0])
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(tasks.square, 4)


def test_after_shutdown_stats_count_no_worker(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    ex.shutdown()
    stats = ex.stats()
    assert (stats.workers, stats.workers_starting) == (0, 0)
    assert all(w.state in ("retired", "lost") for w in ex.workers())


@pytest.mark.parametrize("how", ["wait", "first_exception", "as_completed"])
def test_waiting_in_wait_or_as_completed_sees_every_outcome_and_runs_callbacks_elsewhere(
        make: Make, how: str) -> None:
    """`concurrent.futures.wait` and `as_completed` on tasks of two workers: each outcome
    seen once, an exception where it was raised, and done-callbacks on the executor's own
    thread, not inside the wait (fiberexec's waiting thread reads the answers itself)."""
    ex = make(2)
    ex.submit(tasks.square, 1).result(timeout=60)
    for round_ in range(20):
        time.sleep(0.005)  # (fiberexec: the executor's thread sleeps, the caller sends)
        futures = [ex.submit(tasks.sleep_return, 0.01, round_),
                   ex.submit(tasks.raise_value_error, f"round {round_}")]
        called_on: queue.Queue[str] = queue.Queue()
        for future in futures:
            # A callback added to a future already done runs at once, in the adding thread
            # (documented): the quick task may be done by now, on the stdlib.
            adding = threading.Event()
            adding.set()
            future.add_done_callback(partial(_note_thread_unless, adding, called_on))
            adding.clear()
        if how == "as_completed":
            seen = list(cf.as_completed(futures, timeout=60))
            assert sorted(map(id, seen)) == sorted(map(id, futures))
        else:
            when = cf.FIRST_EXCEPTION if how == "first_exception" else cf.ALL_COMPLETED
            done, _ = cf.wait(futures, timeout=60, return_when=when)
            assert futures[1] in done
        assert futures[0].result(timeout=60) == round_
        with pytest.raises(ValueError, match=f"round {round_}"):
            futures[1].result(timeout=0)
        names = {called_on.get(timeout=60), called_on.get(timeout=60)} - {"(while added)"}
        assert threading.current_thread().name not in names


def _wait_some_way(rng: random.Random, futures: list[cf.Future[Any]]) -> None:
    """Wait for ``futures`` as a program might: each in turn, `wait` (all, or the first
    then the rest), or `as_completed`."""
    way = rng.randrange(4)
    if way == 0:
        for future in futures:
            future.exception(timeout=60)
    elif way == 1:
        assert not cf.wait(futures, timeout=60).not_done
    elif way == 2:
        done, _ = cf.wait(futures, timeout=60, return_when=cf.FIRST_COMPLETED)
        assert done
        assert not cf.wait(futures, timeout=60).not_done
    else:
        assert len(list(cf.as_completed(futures, timeout=60))) == len(futures)


def test_threads_waiting_every_way_at_once_see_every_outcome(make: Make) -> None:
    """Four threads submit a few short tasks at a time (some raise) and wait for them in
    every way the stdlib offers, at once: every outcome is seen, where it was raised."""
    ex = make(2)
    ex.submit(tasks.square, 1).result(timeout=60)

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(25):
            n = rng.randrange(1, 4)
            fails = [rng.random() < 0.3 for _ in range(n)]
            futures = [ex.submit(tasks.raise_value_error, f"{seed}.{i}.{j}") if fail
                       else ex.submit(tasks.sleep_return, rng.choice((0, 0.001, 0.003)),
                                      (seed, i, j))
                       for j, fail in enumerate(fails)]
            _wait_some_way(rng, futures)
            for j, (future, fail) in enumerate(zip(futures, fails, strict=True)):
                if fail:
                    assert str(future.exception(timeout=0)) == f"{seed}.{i}.{j}"
                else:
                    assert future.result(timeout=0) == (seed, i, j)

    at_once(run, [(seed,) for seed in range(4)], timeout=120)


def _note_thread(names: queue.Queue[str], _: cf.Future[Any]) -> None:
    names.put(threading.current_thread().name)


def _note_thread_unless(adding: threading.Event, names: queue.Queue[str],
                        future: cf.Future[Any]) -> None:
    """`_note_thread`, but a call made inside `add_done_callback` itself is noted as such."""
    if adding.is_set() and threading.current_thread() is threading.main_thread():
        names.put("(while added)")
    else:
        _note_thread(names, future)


def test_done_callbacks_run_off_the_waiting_thread_which_may_hold_their_lock(
        make: Make) -> None:
    """A callback added before its task ends runs on the executor's own thread, never
    inside ``result()`` on the thread waiting (which, holding a lock the callback takes,
    would deadlock): fiberexec's waiting thread reads its answer itself, but hands the
    callbacks over."""
    ex = make(2)
    ex.submit(tasks.square, 1).result(timeout=60)
    ran: queue.Queue[tuple[str, bool]] = queue.Queue()
    for i in range(30):
        lock = threading.Lock()

        def callback(_: cf.Future[Any], lock: threading.Lock = lock) -> None:
            got = lock.acquire(timeout=2)  # (on the waiting thread: it could never)
            ran.put((threading.current_thread().name, got))
            if got:
                lock.release()

        time.sleep(0.01)  # (fiberexec: the executor's thread sleeps, the caller sends...)
        # (A task of 50 ms: the callback is added before it ends, as the test means; one
        # added to a done future runs at once on the adding thread, on either executor.)
        future = ex.submit(tasks.sleep_return, 0.05, i * i)
        future.add_done_callback(callback)
        with lock:
            assert future.result(timeout=60) == i * i  # (...and reads the answer itself)
    calls = [ran.get(timeout=60) for _ in range(30)]
    assert all(got for _, got in calls)
    assert threading.current_thread().name not in {name for name, _ in calls}


def test_a_worker_has_a_process_name_of_its_own(make: Make) -> None:
    """logging's ``processName`` tells workers apart: not the ``MainProcess`` of the
    program."""
    with make(1) as ex:
        name = ex.submit(tasks.process_name).result(timeout=60)
    assert name.startswith("SpawnProcess-") or name == "FiberWorker-w0"
