"""The `ProcessPoolExecutor` contract, run against the standard library and fiberexec alike.

Each test takes ``make_pool``, parametrized over ``stdlib`` (`ProcessPoolExecutor`) and
``fiberexec`` (`FiberExecutor` on the backend under test), so the standard library proves
that what is asserted is its contract and not fiberexec's invention. Tests of Python 3.14
additions that this interpreter's stdlib lacks run on fiberexec alone and say so.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import (
    FIRST_COMPLETED,
    BrokenExecutor,
    Executor,
    ProcessPoolExecutor,
    as_completed,
    wait,
)
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool, _RemoteTraceback
from pathlib import Path
from typing import Any

import pytest

from fiberexec import FiberExecutor
from tests import contract_tasks as ct
from tests.conftest import ExecutorFactory
from tests.tasks import identity, negate_inplace, read_only_array

ROOT = Path(__file__).resolve().parents[1]
PoolFactory = Callable[..., Executor]
SYSTEMS = {"stdlib": "ProcessPoolExecutor", "fiberexec": "FiberExecutor"}
IMPORTS = {
    "stdlib": "from concurrent.futures import ProcessPoolExecutor as Executor",
    "fiberexec": "from fiberexec import FiberExecutor as Executor",
}


@pytest.fixture(params=sorted(SYSTEMS))
def system(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_pool(system: str, make_executor: ExecutorFactory) -> Iterator[PoolFactory]:
    made: list[Executor] = []

    def make(max_workers: int = 2, **kwargs: Any) -> Executor:
        if system == "fiberexec":
            return make_executor(max_workers, **kwargs)
        ex = ProcessPoolExecutor(max_workers, **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown(wait=True, cancel_futures=True)


def warm(ex: Executor, workers: int) -> None:
    """Wait until ``workers`` workers have each run a task."""
    assert all(f.result(timeout=60) == 0 for f in [ex.submit(abs, 0) for _ in range(workers)])


# ---------------------------------------------------------------- results arrive in time


def test_finished_results_do_not_wait_behind_the_next_task(make_pool: PoolFactory) -> None:
    ex = make_pool(1)
    warm(ex, 1)
    start = time.monotonic()
    futures = [ex.submit(time.sleep, s) for s in (0, 0, 1.5)]
    seen = [time.monotonic() - start for _ in as_completed(futures, timeout=30)]
    assert seen[1] < 0.75, f"the two instant tasks were reported at {seen[:2]}"
    assert seen[2] >= 1.5


def test_map_timeout_yields_every_result_finished_in_time(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    results = ex.map(time.sleep, [0, 0, 6], timeout=4)
    assert [next(results), next(results)] == [None, None]
    with pytest.raises(FuturesTimeout):
        next(results)


def test_wait_first_completed_sees_the_quick_task(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    warm(ex, 2)
    quick = ex.submit(pow, 2, 8)
    slow = ex.submit(time.sleep, 1.5)
    done, pending = wait([quick, slow], timeout=30, return_when="FIRST_COMPLETED")
    assert done == {quick} and pending == {slow}
    assert quick.result() == 256


def test_a_task_does_not_wait_behind_a_slow_one_while_a_worker_is_free(
        make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    assert list(ex.map(time.sleep, [0.5, 0.5])) == [None, None]  # both workers run sleeps
    start = time.monotonic()
    slow = ex.submit(time.sleep, 1.5)
    time.sleep(0.2)  # the next task comes while one worker runs the slow one, one is free
    quick = ex.submit(time.sleep, 0)
    quick.result(timeout=30)
    elapsed = time.monotonic() - start
    assert not slow.done() and elapsed < 1.0, f"the quick task took {elapsed:.2f}s"
    slow.result(timeout=30)


# ---------------------------------------------------------------- running and cancelling


def test_few_futures_are_running_before_they_run(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    warm(ex, 2)
    futures = [ex.submit(time.sleep, 0.1) for _ in range(50)]
    most = 0
    for _ in range(20):
        most = max(most, sum(f.running() for f in futures))
        time.sleep(0.02)
    # the stdlib: 2 executing, 3 in its call queue, and one finished but not yet reported
    assert most <= 2 * 2 + 2, f"{most} futures marked running with 2 workers"
    assert all(f.result(timeout=60) is None for f in futures)


def test_a_cancelled_call_never_runs_and_its_waiters_hear_of_it(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    """50 instant calls of a function, then 20 of it that run long, cancelled once the first
    finishes: what `cancel()` cancels never runs, the rest all run, and `wait` sees every
    future done."""
    ex = make_pool(2)
    warmups = ex.map(ct.mark_then_sleep, [str(tmp_path / f"warm{i}") for i in range(50)],
                     [0] * 50)
    assert list(warmups) == [None] * 50
    futures = [ex.submit(ct.mark_then_sleep, str(tmp_path / str(i)), 0.3) for i in range(20)]
    wait(futures, timeout=60, return_when=FIRST_COMPLETED)
    running = sum(f.running() for f in futures)
    cancelled = {i for i, f in enumerate(futures) if f.cancel()}
    # The instant warm-ups say nothing of these: the tasks sent ahead to a worker behind a
    # long one are not running yet. The stdlib: 2 running and 3 in its call queue (all
    # marked running), and the first two done (both workers started at once).
    assert running <= 2 * 2 + 2, f"{running} futures marked running with 2 workers"
    assert len(cancelled) >= 20 - (2 + 2 + 3), f"only {len(cancelled)} of 20 could be cancelled"
    assert not wait(futures, timeout=60).not_done
    ex.shutdown(wait=True)
    ran = {i for i in range(20) if (tmp_path / str(i)).exists()}
    assert not cancelled & ran, f"cancelled calls ran: {sorted(cancelled & ran)}"
    assert ran == set(range(20)) - cancelled


def test_shutdown_cancel_futures(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    futures = [ex.submit(time.sleep, 0.1) for _ in range(50)]
    ex.shutdown(cancel_futures=True)
    cancelled = [f for f in futures if f.cancelled()]
    others = [f for f in futures if not f.cancelled()]
    assert len(cancelled) > 20
    assert others, "the tasks already handed to workers must still run"
    for f in others:
        assert f.done()
        assert f.exception() is None


def test_cancelled_future_does_not_hang_shutdown(make_pool: PoolFactory) -> None:
    ex = make_pool(1)
    ex.submit(int).result(timeout=60)
    ex.submit(int).cancel()
    done = threading.Event()
    threading.Thread(target=lambda: (ex.shutdown(wait=True), done.set()), daemon=True).start()
    assert done.wait(15), "shutdown hung after a cancelled submit"


def test_submit_after_shutdown_raises(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    ex.shutdown()
    with pytest.raises(RuntimeError, match="cannot schedule new futures after shutdown"):
        ex.submit(pow, 2, 5)


def test_max_workers_must_be_positive(system: str) -> None:
    cls = FiberExecutor if system == "fiberexec" else ProcessPoolExecutor
    for number in (0, -1):
        with pytest.raises(ValueError, match="max_workers must be greater than 0"):
            cls(max_workers=number)


def test_max_tasks_per_child_refuses_fork(system: str) -> None:
    cls = FiberExecutor if system == "fiberexec" else ProcessPoolExecutor
    with pytest.raises(ValueError, match="max_tasks_per_child is incompatible"):
        cls(1, mp_context=multiprocessing.get_context("fork"), max_tasks_per_child=3)


def test_max_tasks_per_child_replaces_the_worker(make_pool: PoolFactory) -> None:
    ex = make_pool(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=3)
    pids = [ex.submit(os.getpid).result(timeout=60) for _ in range(4)]
    assert pids[0] == pids[1] == pids[2] != pids[3]


# ---------------------------------------------------------------- errors the stdlib's way


def test_remote_traceback_is_the_stdlib_class(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    future = ex.submit(ct.raise_runtime_error)
    with pytest.raises(RuntimeError) as info:
        future.result(timeout=60)
    assert info.value.args == (123,)
    cause = info.value.__cause__
    assert type(cause) is _RemoteTraceback
    assert "raise RuntimeError(123)" in cause.tb


@pytest.mark.parametrize(
    ("fn", "arg", "expected"),
    [
        (id, ct.ErrorAtPickle(), pickle.PicklingError),
        (id, ct.ErrorAtUnpickle(), BrokenProcessPool),
        (id, ct.ExitAtUnpickle(), BrokenProcessPool),
        (ct.return_instance, ct.ErrorAtPickle, pickle.PicklingError),
        (ct.return_instance, ct.ExitAtPickle, SystemExit),
        (ct.return_instance, ct.InterruptAtPickle, KeyboardInterrupt),
        (ct.raise_holding, ct.InterruptAtPickle, KeyboardInterrupt),
        (ct.return_instance, ct.ErrorAtUnpickle, BrokenProcessPool),
        (ct.return_instance, ct.ExitAtUnpickle, BrokenProcessPool),
        (id, threading.Lock(), TypeError),  # what the pickler raised, as the stdlib gives
        (ct.return_instance, threading.Lock, TypeError),
        (ct.raise_holding, threading.Lock, TypeError),
        (ct.nested, 5000, RecursionError),
    ],
    ids=["arg-pickle-error", "arg-unpickle-error", "arg-unpickle-exit", "result-pickle-error",
         "result-pickle-exit", "result-pickle-interrupt", "exception-pickle-interrupt",
         "result-unpickle-error", "result-unpickle-exit",
         "arg-lock", "result-lock", "exception-holding-a-lock", "result-too-deep"],
)
def test_serialization_failures_raise_what_the_stdlib_raises(
    make_pool: PoolFactory, fn: Callable[..., Any], arg: Any, expected: type[BaseException]
) -> None:
    ex = make_pool(2)
    with pytest.raises(expected):
        ex.submit(fn, arg).result(timeout=60)


def test_an_argument_whose_pickling_is_interrupted_fails_its_own_task(
        make_executor: ExecutorFactory) -> None:
    """Not the task beside it, and not the scheduler (the stdlib's queue feeder thread dies
    of it, and its executor hangs: no stdlib run to compare with)."""
    ex = make_executor(2)
    beside = ex.submit(time.sleep, 0.2)
    bad = ex.submit(id, ct.InterruptAtPickle())
    with pytest.raises(pickle.PicklingError) as info:
        bad.result(timeout=60)
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert beside.result(timeout=60) is None
    assert ex.submit(abs, -3).result(timeout=60) == 3


def test_seventy_thousand_arrays_travel_both_ways(make_pool: PoolFactory) -> None:
    """Each numpy array is a pickle-5 buffer of its own: a message once counted them in 16
    bits, and 65,536 of them crashed the executor's scheduler (as an argument) or the
    worker (as a result)."""
    import numpy as np

    ex = make_pool(1)
    arrays = [np.full(2, i, dtype=np.int64) for i in range(70_000)]
    back = ex.submit(identity, arrays).result(timeout=120)
    assert len(back) == 70_000 and all(int(a[1]) == i for i, a in enumerate(back))
    assert ex.submit(identity, 2).result(timeout=60) == 2


@pytest.mark.parametrize("size", [10, 1 << 20])  # in the pickle stream, and out of band
def test_a_read_only_array_arrives_as_a_copy_the_task_may_change(
        make_pool: PoolFactory, size: int) -> None:
    """The task gets its own copy of an argument, and the caller of a result: a writable one,
    whatever the original's ``writeable`` flag (here ``np.frombuffer`` of bytes)."""
    import numpy as np

    ex = make_pool(1)
    array = np.frombuffer(bytes(size), dtype=np.int16)
    assert not array.flags.writeable
    doubled = ex.submit(negate_inplace, array).result(timeout=60)
    assert doubled.flags.writeable and not array.flags.writeable
    back = ex.submit(read_only_array, 200).result(timeout=60)
    back += 1  # the caller's copy too
    assert int(back[0]) == 1


def test_exit_in_a_task_raises_system_exit(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    with pytest.raises(SystemExit):
        ex.submit(ct.exit_interpreter).result(timeout=60)


def test_worker_that_dies_is_a_broken_process_pool(make_pool: PoolFactory) -> None:
    ex = make_pool(1)
    with pytest.raises(BrokenProcessPool):
        ex.submit(ct.exit_process, 99).result(timeout=60)


def test_worker_death_names_its_exit_code(make_executor: ExecutorFactory) -> None:
    """fiberexec only: the stdlib names the exit code this way from Python 3.14 on."""
    ex = make_executor(1, max_task_retries=0)
    with pytest.raises(BrokenProcessPool) as info:
        ex.submit(ct.exit_process, 99).result(timeout=60)
    cause = info.value.__cause__
    assert isinstance(cause, _RemoteTraceback)
    assert "terminated abruptly with exit code 99" in cause.tb


def test_failing_initializer_breaks_the_executor(make_pool: PoolFactory) -> None:
    ex = make_pool(2, initializer=ct.init_fail)
    try:
        future = ex.submit(ct.get_status)
    except BrokenExecutor:
        pass
    else:
        with pytest.raises(BrokenExecutor):
            future.result(timeout=60)
    with pytest.raises(BrokenExecutor):
        ex.submit(ct.get_status)
    assert ex._broken  # type: ignore[attr-defined]


def test_initializer_runs_in_every_worker(make_pool: PoolFactory) -> None:
    ex = make_pool(2, initializer=ct.init_status, initargs=("initialized",))
    assert [f.result(timeout=60) for f in [ex.submit(ct.get_status) for _ in range(4)]] == [
        "initialized"] * 4


# ---------------------------------------------------------------- references and managers


def test_no_stale_references(make_pool: PoolFactory) -> None:
    ex = make_pool(2)
    obj = ct.Tracked()
    collected = threading.Event()
    ref = weakref.ref(obj, lambda _: collected.set())
    ex.submit(obj.method).result(timeout=60)
    del obj
    gc.collect()
    assert collected.wait(10), "the executor still holds the task's function"
    assert ref() is None


def test_stdlib_manager_proxies_work_in_tasks_and_initargs(make_pool: PoolFactory) -> None:
    with multiprocessing.Manager() as manager:
        shared = manager.dict()
        event = manager.Event()
        ex = make_pool(2, initializer=ct.set_item, initargs=(shared, -1))
        keys = [f.result(timeout=60) for f in [ex.submit(ct.set_item, shared, k) for k in range(4)]]
        assert keys == [0, 1, 2, 3]
        assert ex.submit(ct.set_event, event).result(timeout=60)
        assert event.is_set()
        assert {k: shared[k] for k in range(4)} == {k: k * k for k in range(4)}
        assert shared[-1] == 1
        ex.shutdown()


# ---------------------------------------------------------------- Python 3.14 additions


def test_map_buffersize_validates_like_cpython(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    with pytest.raises(TypeError, match="buffersize must be an integer or None"):
        ex.map(abs, [1], buffersize=2.0)  # type: ignore[arg-type]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="buffersize must be None or > 0"):
            ex.map(abs, [1], buffersize=bad)


@pytest.mark.parametrize("chunksize", [1, 3])
def test_map_buffersize_reads_inputs_lazily(
    make_executor: ExecutorFactory, chunksize: int
) -> None:
    ex = make_executor(2)
    consumed = itertools.count()
    source = (next(consumed) for _ in itertools.count())  # endless
    results = ex.map(abs, source, buffersize=2, chunksize=chunksize, timeout=60)
    assert [next(results) for _ in range(10)] == list(range(10))
    # at most 2 buffered tasks (chunks) ahead of what was consumed
    assert next(consumed) <= 10 + 2 * chunksize + chunksize


@pytest.mark.parametrize("method", ["terminate_workers", "kill_workers"])
def test_force_shutdown_fails_running_tasks(make_executor: ExecutorFactory, method: str) -> None:
    ex = make_executor(1)
    running = ex.submit(time.sleep, 60)
    with pytest.raises(FuturesTimeout):
        running.result(timeout=0.5)
    getattr(ex, method)()
    with pytest.raises(BrokenProcessPool):
        running.result(timeout=30)
    with pytest.raises(RuntimeError):
        ex.submit(time.sleep, 0)


def test_force_shutdown_rejects_unknown_operation(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    with pytest.raises(ValueError, match="Unsupported operation"):
        ex._force_shutdown(operation="invalid operation")


def test_a_thread_a_task_left_running_finishes_before_shutdown_returns(
        make_pool: PoolFactory, tmp_path: Path) -> None:
    """As the stdlib's worker does when it ends: it waits for the threads its tasks started
    that are not daemons, so a write a task left to one completes."""
    ex = make_pool(1)
    path = tmp_path / "written"
    assert ex.submit(ct.write_in_a_thread, str(path), 0.3).result(timeout=60)
    ex.shutdown(wait=True)
    assert path.read_text() == "written"


# ---------------------------------------------------------------- interpreter exit


def run_program(system: str, body: str, timeout: float = 60) -> tuple[str, str, float]:
    """Run ``body`` in a fresh interpreter with ``Executor`` imported; (out, err, seconds)."""
    code = IMPORTS[system] + "\n" + textwrap.dedent(body)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), proc.stderr, elapsed


def test_exit_finishes_pending_futures(system: str) -> None:
    out, err, _ = run_program(system, """
        from tests.contract_tasks import sleep_and_print
        if __name__ == "__main__":
            ex = Executor(5)
            ex.submit(sleep_and_print, 1.0, "apple")
    """)
    assert out == "apple"
    assert err == ""


@pytest.mark.parametrize("handler", ["ctrl-c", "alarm"])
def test_a_signal_as_a_result_is_taken_in_interrupts_the_waiter_and_loses_nothing(
        system: str, handler: str) -> None:
    """A signal whose handler raises (Ctrl-C's ``KeyboardInterrupt``, or a SIGALRM handler's
    timeout), arriving while a result is taken in (here: as it is unpickled, which happens
    on whichever thread reads the worker's answer: in fiberexec mostly this one, which waits
    on the worker itself), interrupts the program where it waits, and the result is kept; the
    worker serves on, the ``with`` block's shutdown returns, and the handler is the
    program's again. (It once landed inside the reading: the result became an
    `UnpicklingError`, or was lost with the ones read with it, and the shutdown waited for
    those forever.)"""
    out, _err, _ = run_program(system, f"""
        import signal, time
        from tests import tasks

        class Alarm(Exception):
            pass

        def on_alarm(signum, frame):
            raise Alarm

        if __name__ == "__main__":
            signum = signal.SIGINT if {handler!r} == "ctrl-c" else signal.SIGALRM
            if signum == signal.SIGALRM:
                signal.signal(signal.SIGALRM, on_alarm)
            mine = signal.getsignal(signum)
            with Executor(1) as ex:
                ex.submit(tasks.identity, 0).result(timeout=60)
                time.sleep(0.2)  # (fiberexec: the worker idle, the shard's thread asleep)
                # (2 ms: the answer comes once this thread waits in result(), not while a
                # descheduled submit has yet to return, and within fiberexec's 5 ms of
                # reading the worker itself)
                f = ex.submit(tasks.return_signal_as_unpickled, signum, 7, 0.002)
                try:
                    f.result(timeout=60)
                    time.sleep(3)  # where the stdlib's main thread hears of it
                    print("not interrupted")
                except (KeyboardInterrupt, Alarm) as exc:
                    print("interrupted by", type(exc).__name__)
                print(f.result(timeout=0), ex.submit(tasks.identity, 2).result(timeout=30))
            print("shut down", signal.getsignal(signum) is mine)
    """)
    raised = "KeyboardInterrupt" if handler == "ctrl-c" else "Alarm"
    assert out.splitlines() == [f"interrupted by {raised}", "7 2", "shut down True"]


def test_a_quick_program_hears_nothing_from_workers_still_starting(system: str) -> None:
    """The first result comes before the other workers connect; shutting down then stops
    them without a word on stderr (a hang-up is not a fault when the executor left)."""
    out, err, _ = run_program(system, """
        if __name__ == "__main__":
            for _ in range(4):
                with Executor(4) as ex:
                    print(ex.submit(abs, -1).result())
    """)
    assert out.split() == ["1"] * 4
    assert err == ""


def test_exit_finishes_running_futures_after_shutdown_without_wait() -> None:
    """fiberexec only: the stdlib's process pool may hang here (CPython gh-83386)."""
    out, err, _ = run_program("fiberexec", """
        from tests.contract_tasks import sleep_and_print
        if __name__ == "__main__":
            ex = Executor(2)
            futures = [ex.submit(sleep_and_print, 0.3, i) for i in range(4)]
            futures[0].running() or futures[0].result()
            ex.shutdown(wait=False)
    """)
    assert sorted(out.split()) == ["0", "1", "2", "3"]
    assert err == ""


def test_exit_with_an_unused_executor_costs_nothing(system: str) -> None:
    out, err, elapsed = run_program(system, """
        if __name__ == "__main__":
            ex = Executor(5)
            print("done")
    """)
    assert (out, err) == ("done", "")
    assert elapsed < 10


def test_submit_from_atexit_raises_and_exits(system: str) -> None:
    out, err, elapsed = run_program(system, """
        import atexit
        @atexit.register
        def run_last():
            try:
                ex.submit(id, None)
            except RuntimeError:
                print("runtime-error")
                raise
        if __name__ == "__main__":
            ex = Executor(5)
    """, timeout=30)
    assert out == "runtime-error"
    assert "RuntimeError: cannot schedule new futures" in err
    assert elapsed < 20


def test_exit_from_a_non_main_thread_finishes_its_futures() -> None:
    """fiberexec only: run against the stdlib's process pool (fork), this program lost its
    output now and then on a loaded machine, so the stdlib cannot vouch for it here."""
    out, err, _ = run_program("fiberexec", """
        import threading
        from tests.contract_tasks import sleep_and_print
        submitted = threading.Event()
        def work():
            ex = Executor(2)
            futures = [ex.submit(sleep_and_print, 0.2, f"t{i}") for i in range(3)]
            submitted.set()
            print(*[f.result() for f in futures])
        if __name__ == "__main__":
            threading.Thread(target=work).start()
            submitted.wait(30)
    """)
    assert sorted(out.split()) == ["None", "None", "None", "t0", "t1", "t2"]
    assert err == ""


def test_exit_with_workers_that_never_connect_fails_within_seconds() -> None:
    """fiberexec only: a stdlib pool's workers are forked, they cannot fail to connect."""
    out, _, elapsed = run_program("fiberexec", """
        from tests.contract_tasks import SilentBackend
        if __name__ == "__main__":
            ex = Executor(2, backend=SilentBackend(), start_timeout=600)
            future = ex.submit(abs, -1)
            future.add_done_callback(lambda f: print(type(f.exception()).__name__))
    """)
    assert out == "BrokenFiberExecutor"
    assert elapsed < 30, f"exit took {elapsed:.1f}s"
