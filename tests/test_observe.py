"""workers(), task_spans(), task_durations(), failures() and dump_stack() with real local
workers.

A task (or an initializer) that must be caught in the act says so on a pipe and waits on
another (`tasks.hold_until`), so each state is looked at when it surely holds.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import fiberexec
from fiberexec import (
    Durations,
    FailureInfo,
    FiberExecutor,
    PicklingError,
    TaskInfo,
    TaskSpan,
    WorkerInfo,
    WorkerLostError,
)
from tests import tasks
from tests.conftest import ExecutorFactory


@contextmanager
def held() -> Iterator[tuple[Any, Any, Any]]:
    """(the worker's ends to pass, the started reader, the release writer)."""
    started_r, started_w = multiprocessing.Pipe(duplex=False)
    release_r, release_w = multiprocessing.Pipe(duplex=False)
    try:
        yield (started_w, release_r), started_r, release_w
    finally:
        for conn in (started_r, started_w, release_r, release_w):
            conn.close()


def only(ex: FiberExecutor) -> WorkerInfo:
    infos = ex.workers()
    assert len(infos) == 1, infos
    return infos[0]


def test_the_executor_id_names_it_in_the_log_and_its_workers(
        make_executor: ExecutorFactory, caplog: pytest.LogCaptureFixture) -> None:
    ex = make_executor(1)
    executor_id = ex.executor_id  # known before anything starts, and it stays
    assert len(executor_id) == 8 and executor_id != make_executor(1).executor_id
    with caplog.at_level("INFO", logger="fiberexec"):
        assert ex.submit(abs, -2).result(timeout=60) == 2
    (worker,) = ex.workers()
    assert ex.executor_id == executor_id
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"executor {executor_id} starts: backend ") for m in logged)
    assert any(m.startswith(f"started worker {worker.worker_id} of executor {executor_id} ")
               for m in logged), logged
    assert worker.executor_id == executor_id


def test_no_workers_before_the_first_task() -> None:
    ex = FiberExecutor(1)
    assert ex.workers() == [] and ex.task_spans() == [] and ex.failures() == []
    assert ex.task_durations().count == 0 and ex.task_durations().total == 0
    with pytest.raises(LookupError, match="no worker 'w0'"):
        ex.dump_stack("w0")
    ex.shutdown()


def test_a_worker_goes_from_starting_to_idle_running_and_retired(
        make_executor: ExecutorFactory) -> None:
    with held() as (init_args, init_started, init_release):
        ex = make_executor(1, initializer=tasks.hold_init, initargs=init_args)
        first = ex.submit(tasks.square, 3)
        assert init_started.poll(30), "the initializer did not start"
        worker = only(ex)
        assert worker.state == "starting" and worker.backend == "local"
        assert worker.reference and worker.host == os.uname().nodename
        stack = ex.dump_stack(worker.worker_id, timeout=30)  # it says what it runs
        assert "running the initializer" in stack and "hold_init" in stack
        stats = ex.stats()  # connected (it answered), not ready: starting, as workers() says
        assert (stats.workers, stats.workers_starting) == (0, 1)
        init_release.send(None)
        assert first.result(timeout=30) == 9
    worker = only(ex)
    assert (worker.state, worker.task, worker.tasks_done, worker.tasks_failed,
            worker.ended) == ("idle", None, 1, 0, None)
    assert worker.rss_bytes is not None and worker.rss_bytes > 1 << 20
    assert worker.cpu_percent is not None and worker.cpu_percent >= 0
    assert worker.last_heard is not None and abs(worker.last_heard - time.time()) < 30

    with held() as (args, started, release):
        before = time.time()
        future = ex.submit(tasks.hold_until, *args)
        assert started.poll(30), "the task did not start"
        worker = only(ex)
        assert worker.state == "running" and isinstance(worker.task, TaskInfo)
        assert worker.task.function == "tests.tasks.hold_until"
        # each argument by its class (reprlib would keep "<multiproc...x7f12>")
        assert worker.task.arguments == "<connection.Connection>, <connection.Connection>"
        assert before - 1 <= worker.task.started <= time.time()
        stack = ex.dump_stack(worker.worker_id, timeout=10)
        assert "hold_until" in stack and "running the task" in stack
        release.send("done")
        assert future.result(timeout=30) == "done"
    ex.shutdown()
    worker = only(ex)
    assert (worker.state, worker.tasks_done, worker.ended) == (
        "retired", 2, "the executor shut down")
    assert (worker.cpu_percent, worker.rss_bytes) == (None, None)  # no process uses them
    with pytest.raises(LookupError, match="retired"):
        ex.dump_stack(worker.worker_id)


def test_a_running_tasks_arguments_are_described_once_for_every_snapshot(
        make_executor: ExecutorFactory) -> None:
    # (a dashboard snapshots a long task every second: its arguments' repr may be costly)
    ex = make_executor(1)
    argument = tasks.CountedRepr()
    with held() as (args, started, release):
        future = ex.submit(tasks.hold_with, *args, argument)
        assert started.poll(30), "the task did not start"
        before = tasks.CountedRepr.shown
        arguments = {only(ex).task.arguments for _ in range(5)}  # type: ignore[union-attr]
        assert arguments == {"<connection.Connection>, <connection.Connection>, <counted>"}
        assert tasks.CountedRepr.shown - before == 1
        release.send("done")
        assert future.result(timeout=30) == "done"


def test_a_running_chunk_of_a_map_is_shown_by_the_users_function(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    with held() as (args, started, release):
        results = ex.map(tasks.hold_until, [args[0]], [args[1]], chunksize=2)
        assert started.poll(30)
        task = only(ex).task
        assert task is not None and task.function == "tests.tasks.hold_until"
        # the first item's call, as it reads inside f(...)
        assert task.arguments.startswith("<connection.Connection>, <connection.Con")
        assert task.arguments.endswith(" [the first of a chunk of 1 map item]")
        release.send(7)
        assert list(results) == [7]
    spans = ex.task_spans()
    assert [s.function for s in spans] == ["tests.tasks.hold_until"]


def test_spans_and_failures_say_what_ran_where_and_how_it_ended(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    t0 = time.time()
    assert ex.submit(tasks.square, 4).result(timeout=30) == 16
    with pytest.raises(ValueError, match="boom"):
        ex.submit(tasks.raise_value_error, "boom").result(timeout=30)
    worker = only(ex)
    assert (worker.tasks_done, worker.tasks_failed) == (1, 1)
    spans = ex.task_spans()
    assert all(isinstance(s, TaskSpan) for s in spans)
    assert [(s.function, s.ok, s.worker_id) for s in spans] == [
        ("tests.tasks.square", True, worker.worker_id),
        ("tests.tasks.raise_value_error", False, worker.worker_id),
    ]
    assert all(t0 - 1 <= s.started <= s.ended <= time.time() for s in spans)
    assert ex.task_spans(since=spans[1].ended) == spans[1:]
    assert ex.task_spans(since=time.time() + 60) == []
    (failure,) = ex.failures()
    assert isinstance(failure, FailureInfo)
    assert (failure.task_id, failure.worker_id, failure.function, failure.arguments) == (
        spans[1].task_id, worker.worker_id, "tests.tasks.raise_value_error", "'boom'")
    assert failure.error == "ValueError: boom"
    assert "raise_value_error" in failure.traceback and "Traceback" in failure.traceback
    assert ex.failures(limit=0) == []
    assert list(ex.map(tasks.square, range(6), chunksize=3)) == [0, 1, 4, 9, 16, 25]
    worker = only(ex)  # a map's items, as stats() counts them: not the two chunks
    assert (worker.tasks_done, worker.tasks_failed) == (7, 1)
    assert (ex.stats().tasks_done, ex.stats().tasks_failed) == (7, 1)


def test_tasks_cancelled_in_the_queue_are_not_pending(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    with held() as (args, started, release):
        running = ex.submit(tasks.hold_until, *args)
        assert started.poll(30)
        queued = [ex.submit(tasks.square, i) for i in range(3)]
        assert ex.stats().tasks_pending == 3
        assert all(f.cancel() for f in queued[1:])
        stats = ex.stats()
        assert (stats.tasks_pending, stats.tasks_running) == (1, 1)
        release.send(1)
        assert running.result(timeout=30) == 1 and queued[0].result(timeout=30) == 0
    assert ex.stats().tasks_pending == 0


def test_a_chunked_maps_counts_add_up_while_it_runs(make_executor: ExecutorFactory) -> None:
    """Pending and running count a chunk's items one by one, as done and submitted do, so
    the four add up to what was submitted at every moment (they counted chunks)."""
    ex = make_executor(1)
    with held() as (args, started, release):
        ex.submit(tasks.hold_until, *args)
        assert started.poll(30)
        results = ex.map(tasks.square, range(20), chunksize=5)
        stats = ex.stats()
        assert (stats.tasks_pending, stats.tasks_running, stats.tasks_submitted) == (20, 1, 21)
        release.send(1)
        assert list(results) == [i * i for i in range(20)]
    stats = ex.stats()
    assert (stats.tasks_pending, stats.tasks_running, stats.tasks_done) == (0, 0, 21)


def test_a_call_is_shown_through_partials_and_batches() -> None:
    """What runs is shown as its user wrote it: a partial with its own arguments and
    keywords; a batch of calls (joblib's) by its first, through `operator.call`."""
    import functools
    import operator

    from fiberexec._task import WorkItem, describe_call, span_function

    def shown(fn: Any, *args: Any) -> tuple[str, str, str]:
        item = WorkItem(1, concurrent.futures.Future(), fn, args, {})
        return (*describe_call(item), span_function(item))

    assert shown(functools.partial(tasks.square, tag="p"), 2) == (
        "tests.tasks.square", "2, tag='p'", "tests.tasks.square")
    joblib = pytest.importorskip("joblib")
    batch = joblib.parallel.BatchedCalls(
        [(tasks.square, (3,), {}), (tasks.square, (4,), {})], (None, None))
    assert shown(operator.call, batch) == (
        "tests.tasks.square", "3 [the first of a batch of 2 calls]", "tests.tasks.square")


def test_task_durations_count_each_finished_task_in_its_bucket(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert ex.submit(tasks.sleep_return, 0.3, "slept").result(timeout=30) == "slept"
    with pytest.raises(ValueError, match="boom"):
        ex.submit(tasks.raise_value_error, "boom").result(timeout=30)
    durations = ex.task_durations()
    bounds = durations.bounds
    assert bounds[-1] == math.inf and list(bounds) == sorted(bounds)
    assert durations.count == 2
    expected = [0] * len(bounds)
    runtimes = [s.ended - s.started for s in ex.task_spans()]  # as the worker measured them
    for runtime in runtimes:
        i = next(i for i, bound in enumerate(bounds) if runtime <= bound)
        expected[i] += 1
    assert list(durations.counts) == expected
    assert runtimes[0] >= 0.3 and durations.total == pytest.approx(sum(runtimes), abs=1e-6)


def test_a_lost_worker_is_listed_as_lost_and_its_task_as_a_failure(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, max_task_retries=0)
    with pytest.raises(WorkerLostError):
        ex.submit(tasks.kill_self).result(timeout=30)
    assert ex.submit(tasks.square, 2).result(timeout=30) == 4  # on a replacement
    states = {w.worker_id: w.state for w in ex.workers()}
    assert sorted(states.values()) == ["idle", "lost"], states
    readings = {w.state: (w.cpu_percent, w.rss_bytes) for w in ex.workers()}
    assert readings["lost"] == (None, None) and readings["idle"][1] is not None
    # how it ended is its record's, whether or not a task ran on it
    assert {w.state: w.ended for w in ex.workers()} == {
        "lost": "was killed by signal 9 (SIGKILL)", "idle": None}
    (failure,) = ex.failures()
    lost = next(w for w, state in states.items() if state == "lost")
    assert failure.worker_id == lost and failure.function == "tests.tasks.kill_self"
    assert failure.error.startswith("WorkerLostError: ")
    assert f"worker {lost} terminated abruptly" in failure.traceback
    spans = [(s.task_id, s.worker_id, s.function, s.ok) for s in ex.task_spans()]
    assert spans[0] == (failure.task_id, lost, "tests.tasks.kill_self", False)  # a red bar
    # the durations count it as the spans do: every finished task, the lost one too
    kept = ex.task_spans()
    durations = ex.task_durations()
    assert durations.count == len(kept) == 2
    assert durations.total == pytest.approx(sum(s.ended - s.started for s in kept), abs=1e-6)


def test_dump_stack_of_an_unknown_worker_names_the_connected_ones(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    ex.submit(tasks.square, 1).result(timeout=30)
    worker = only(ex)
    with pytest.raises(LookupError, match=f"no worker 'w99'.*connected workers: "
                                          f"{worker.worker_id}"):
        ex.dump_stack("w99")
    assert "Thread" in ex.dump_stack(worker.worker_id)  # an idle worker answers too


def test_dump_stack_of_a_stopped_worker_times_out_and_says_why(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    ex.submit(tasks.square, 1).result(timeout=30)
    worker = only(ex)
    pid = int(worker.reference)
    os.kill(pid, signal.SIGSTOP)  # stopped before it can read what is sent next
    try:
        with pytest.raises(TimeoutError, match=f"worker {worker.worker_id} did not send its "
                                               f"stack within timeout=0.5s"):
            ex.dump_stack(worker.worker_id, timeout=0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "fiberexec-outbox" in ex.dump_stack(worker.worker_id, timeout=30)


def test_a_stack_dump_names_the_thread_that_writes_it() -> None:
    """Whichever of the worker's threads answers, no thread is left out of its report."""
    from fiberexec._introspect import format_stacks

    report: list[str] = []
    answering = threading.Thread(
        target=lambda: report.append(format_stacks(threading.main_thread().ident, doing=None)),
        name="answering")
    answering.start()
    answering.join(timeout=30)
    (text,) = report
    assert text.startswith(f'Thread "MainThread" ({threading.main_thread().ident}), idle')
    assert f'Thread "answering" ({answering.ident}), writing this report\n' in text
    assert "format_stacks" not in text  # its own frames would say nothing


def test_joblib_shows_the_workers_of_its_executors() -> None:
    pytest.importorskip("joblib")
    from joblib import Parallel, delayed, parallel_config

    import fiberexec.joblib

    try:
        with parallel_config(backend="fiber", n_jobs=2):
            assert Parallel()(delayed(tasks.square)(i) for i in range(4)) == [0, 1, 4, 9]
        infos = fiberexec.joblib.workers()
        assert infos and sum(w.tasks_done for w in infos) >= 1
    finally:
        fiberexec.joblib.shutdown_executors()


def test_the_info_values_are_frozen_and_exported() -> None:
    info = TaskInfo(1, "m.f", "1, 2", 0.0)
    with pytest.raises(AttributeError):
        info.task_id = 2  # type: ignore[misc]
    for name in ("WorkerInfo", "TaskInfo", "TaskSpan", "FailureInfo", "Durations"):
        assert name in fiberexec.__all__


def test_the_info_values_print_rounded_and_keep_every_digit() -> None:
    task = TaskInfo(3, "m.f", "1", 1795923217.1384485)
    info = WorkerInfo("w1", "local", "10", "vm", "running", task, 2, 0, 35.72123379705076,
                      17264640, 1795923217.1384485, None, "3f2a91c0")
    assert repr(info) == (
        "WorkerInfo(worker_id='w1', backend='local', reference='10', host='vm', "
        "state='running', task=TaskInfo(task_id=3, function='m.f', arguments='1', "
        "started=1795923217.1), tasks_done=2, tasks_failed=0, cpu_percent=35.7, "
        "rss_bytes=17264640, last_heard=1795923217.1, ended=None, executor_id='3f2a91c0')")
    assert info.cpu_percent == 35.72123379705076 and task.started == 1795923217.1384485
    assert repr(Durations((0.001, math.inf), (1, 2), 0.0123456)) == (
        "Durations(bounds=(0.001, inf), counts=(1, 2), total=0.0123)")
    assert repr(WorkerInfo("w2", "local", "", "", "starting", None, 0, 0, None, None, None)
                ).endswith("cpu_percent=None, rss_bytes=None, last_heard=None, ended=None, "
                           "executor_id='')")


def test_multiprocessing_pool_shows_its_workers() -> None:
    from fiberexec.multiprocessing import Pool

    with Pool(1) as pool:
        assert pool.workers() == []
        assert pool.apply(tasks.square, (3,)) == 9
        (worker,) = pool.workers()
        assert worker.state == "idle" and worker.tasks_done == 1


def test_task_spans_limit_keeps_the_newest(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert list(ex.map(tasks.square, range(20))) == [i * i for i in range(20)]
    spans = ex.task_spans()
    assert len(spans) == 20
    assert ex.task_spans(limit=5) == spans[-5:]
    assert ex.task_spans(limit=0) == [] and ex.task_spans(limit=50) == spans


def test_task_spans_limit_keeps_the_newest_over_every_shard(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(4, shards=2)
    assert list(ex.map(tasks.square, range(60))) == [i * i for i in range(60)]
    spans = ex.task_spans()
    assert len(spans) == 60 and [s.ended for s in spans] == sorted(s.ended for s in spans)
    for limit in (1, 7, 30, 59, 60, 61):
        assert ex.task_spans(limit=limit) == spans[-limit:]
    for since in (spans[40].ended, spans[57].ended):  # (results that came together tie)
        assert ex.task_spans(since=since, limit=5) == [s for s in spans if s.ended >= since][-5:]


def test_a_failures_traceback_stays_as_it_was_when_its_caller_raises_it(
        make_executor: ExecutorFactory) -> None:
    """A failure in this process (arguments that cannot be pickled): `result()` raising it
    again adds the caller's frames to the exception, not to what `failures()` shows."""
    ex = make_executor(1)
    future = ex.submit(tasks.identity, threading.Lock())
    assert isinstance(future.exception(timeout=30), PicklingError)
    (before,) = ex.failures()
    with pytest.raises(PicklingError):
        future.result(timeout=30)
    (after,) = ex.failures()
    assert after.traceback == before.traceback
    assert "test_a_failures_traceback_stays" not in after.traceback


def test_workers_are_listed_by_id_across_shards(make_executor: ExecutorFactory) -> None:
    ex = make_executor(12, shards=3, min_workers=12)
    for f in [ex.submit(tasks.sleep_return, 0.3) for _ in range(24)]:
        f.result(timeout=60)
    served = [w.worker_id for w in ex.workers() if w.state in ("idle", "running")]
    assert len(served) == 12
    assert served == sorted(served, key=lambda worker_id: int(worker_id[1:]))


def test_records_of_workers_that_left_keep_no_read_buffer(make_executor: ExecutorFactory) -> None:
    """workers() remembers up to 256 workers that left; a record once kept its link's read
    buffer, as large as the largest message the worker sent: with workers replaced after
    each task (max_tasks_per_child=1), 256 of them held 98 MiB."""
    import gc

    from fiberexec._framing import FrameBuffer

    gc.collect()
    before = [b for b in gc.get_objects() if type(b) is FrameBuffer]  # (kept: ids stay)
    ex = make_executor(2, max_tasks_per_child=1)
    assert all(len(r) == 300_000 for r in ex.map(tasks.sized_bytes, [300_000] * 24))
    assert sum(w.state != "running" for w in ex.workers()) >= 20  # those records are there
    gc.collect()
    old = {id(b) for b in before}
    alive = [b for b in gc.get_objects() if type(b) is FrameBuffer and id(b) not in old]
    assert len(alive) <= 8  # the links of the workers alive (and starting), not of 24 gone


@pytest.mark.parametrize("cls", [WorkerInfo, TaskInfo, TaskSpan])
def test_a_snapshots_records_are_built_as_their_class_builds_them(cls: type) -> None:
    """Snapshots build their records without the frozen ``__init__`` (thousands a call):
    each such record equals, field by field, the one the class makes, stays frozen, and a
    wrong number of values is refused."""
    from dataclasses import FrozenInstanceError, fields

    from fiberexec import _observe

    build = {WorkerInfo: _observe._worker, TaskInfo: _observe._task,
             TaskSpan: _observe._span}[cls]
    values = [f"value {i}" for i in range(len(fields(cls)))]
    built = build(*values)
    assert type(built) is cls
    assert built == cls(*values)
    assert [getattr(built, f.name) for f in fields(cls)] == values
    with pytest.raises(FrozenInstanceError):
        setattr(built, fields(cls)[0].name, "another")
    with pytest.raises(TypeError):
        build(*values[:-1])
