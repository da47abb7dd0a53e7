"""Failure semantics: nothing is lost, nothing hangs, every error says why."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from fiberexec import (
    FiberExecutor,
    PermanentBackendError,
    RemoteTraceback,
    RetryPolicy,
    SerializationError,
    TransientBackendError,
    WorkerLostError,
)
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.kit import BackendKit


def test_task_exception_carries_remote_traceback(executor: FiberExecutor) -> None:
    with pytest.raises(ValueError, match="broken input") as info:
        executor.submit(tasks.raise_value_error, "broken input").result(timeout=30)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "raise_value_error" in str(cause) and "broken input" in str(cause)
    assert executor.submit(tasks.square, 3).result(timeout=30) == 9  # the worker lives on


def test_an_exception_that_cannot_be_rebuilt_here_keeps_the_remote_traceback(
        executor: FiberExecutor) -> None:
    """Its class's ``__init__`` wants more than its ``args``: the future fails with what
    went wrong and how to mend it, naming the task, and the worker's traceback is still
    its cause."""
    with pytest.raises(SerializationError, match=(
            r"cannot unpickle the exception raised by the task: TypeError: .*missing 1 "
            r"required positional argument: 'code'; pickle rebuilds an exception by calling "
            r"its class with its args, so pass every argument of its __init__ on to "
            r"super\(\).__init__\(\), or give the class a __reduce__ "
            r"\(the task: tests.tasks.raise_two_arg")) as info:
        executor.submit(tasks.raise_two_argument_error, "deep fault").result(timeout=30)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "raise_two_argument_error" in str(cause) and "TwoArgumentError: deep fault" in str(cause)


def test_an_exception_that_cannot_be_pickled_is_said_plainly(executor: FiberExecutor) -> None:
    with pytest.raises(SerializationError) as info:
        executor.submit(tasks.raise_unpicklable_error, "x").result(timeout=30)
    assert str(info.value) == ("the task raised UnpicklableError('x'), which cannot be pickled "
                               "to be sent back: TypeError: not this one")
    assert "raise_unpicklable_error" in str(info.value.__cause__)


def test_unpicklable_argument_fails_only_its_future(executor: FiberExecutor) -> None:
    bad = executor.submit(tasks.identity, threading.Lock())
    good = executor.submit(tasks.square, 5)
    with pytest.raises(SerializationError, match="cannot pickle the arguments"):
        bad.result(timeout=30)
    assert good.result(timeout=30) == 25


def test_unpicklable_function_fails_only_its_future(executor: FiberExecutor) -> None:
    lock = threading.Lock()
    bad = executor.submit(lambda: lock)
    with pytest.raises(SerializationError, match="cannot pickle the function"):
        bad.result(timeout=30)
    assert executor.submit(tasks.square, 6).result(timeout=30) == 36


def test_unpicklable_result_fails_only_its_future(executor: FiberExecutor) -> None:
    with pytest.raises(SerializationError, match="cannot pickle the result"):
        executor.submit(tasks.return_unpicklable).result(timeout=30)
    assert executor.submit(tasks.square, 7).result(timeout=30) == 49


def test_a_result_whose_unpickling_interrupts_fails_only_its_future(
        executor: FiberExecutor) -> None:
    """Rebuilding it raises KeyboardInterrupt, in the executor's scheduler: that thread
    goes on, and the future fails with what was raised."""
    future = executor.submit(tasks.return_interrupting)
    with pytest.raises(SerializationError, match="KeyboardInterrupt: raised while unpickling"):
        future.result(timeout=30)
    assert executor.submit(tasks.square, 7).result(timeout=30) == 49


def test_a_task_lost_once_says_one_worker(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, max_task_retries=0)
    with pytest.raises(WorkerLostError, match=r"on 1 worker that died: it exited with code 3"):
        ex.submit(tasks.exit_now, 3).result(timeout=60)


def test_task_calling_os_exit_fails_after_retries(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, max_task_retries=1)
    with pytest.raises(WorkerLostError, match=r"2 workers that died.*exited with code 13"):
        ex.submit(tasks.exit_now, 13).result(timeout=60)
    assert ex.submit(tasks.square, 2).result(timeout=60) == 4
    assert ex.stats().workers_lost == 2


def test_killed_worker_names_the_signal(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, max_task_retries=0)
    # Kubernetes reports a signal as its container runtime does: 128 + 9
    with pytest.raises(WorkerLostError, match=r"signal 9 .SIGKILL.|exited with code 137"):
        ex.submit(tasks.kill_self).result(timeout=60)


def test_a_fault_that_ends_a_worker_says_where_in_the_error(kit: BackendKit) -> None:
    """The interpreter's own report of a fault in native code (`faulthandler`: the signal
    and the task's frames), from the worker's log, is in the error's cause: on a remote
    backend the worker's stderr is in its log, not on the user's terminal."""
    backend = kit.contract.make_backend()  # one that keeps its workers' output (local too)
    try:
        with (FiberExecutor(1, backend=backend, max_task_retries=0, heartbeat=0.5,
                            **kit.executor_kwargs) as ex,
              pytest.raises(WorkerLostError, match=r"signal 11|code 139") as info):
            ex.submit(tasks.segfault_after, 0.0).result(timeout=60)
    finally:
        backend.close()
    cause = str(info.value.__cause__)
    if kit.contract.logs_after_exit:  # else kept only when the read wins the race
        assert "Fatal Python error: Segmentation fault" in cause, cause
        assert 'tasks.py", line' in cause and "in segfault_after" in cause, cause


def test_worker_killed_mid_map_costs_nothing(
    make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    ex = make_executor(2)
    marker = str(tmp_path / "killed")
    values = list(range(60))
    results = list(ex.map(tasks.kill_self_once, [marker] * 60, values, timeout=120))
    assert results == values
    assert Path(marker).exists()
    stats = ex.stats()
    assert stats.workers_lost == 1 and stats.tasks_retried >= 1


def test_hung_worker_is_replaced(make_executor: ExecutorFactory, tmp_path: Path) -> None:
    """A worker that hangs with its connection open is lost after ``silence_timeout``."""
    ex = make_executor(2, heartbeat=0.3, silence_timeout=1.0)
    marker = str(tmp_path / "hung")
    results = list(ex.map(tasks.hang_once, [marker] * 20, range(20), timeout=120))
    assert results == list(range(20))
    assert ex.stats().workers_lost == 1


def test_large_arrays_round_trip_writable(executor: FiberExecutor) -> None:
    array = np.arange(3 << 20, dtype=np.int64)  # 24 MiB: the shared-memory path locally
    result = executor.submit(tasks.negate_inplace, array).result(timeout=60)
    assert result.flags.writeable and np.array_equal(result, -array)
    assert array[1] == 1  # the caller's array was not touched
    small = np.arange(10)
    assert np.array_equal(executor.submit(tasks.identity, small).result(timeout=30), small)


class _FlakyBackend(LocalBackend):
    """A real local backend whose first starts fail the way a busy daemon would."""

    def __init__(self, failures: int, error: type[Exception]) -> None:
        super().__init__()
        self.failures, self.error, self.calls = failures, error, 0

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"simulated failure {self.calls}")
        return super().start_worker(spec)


FAST_RETRY = RetryPolicy(attempts=4, deadline=10, initial=0.01, maximum=0.05, jitter=0.01)


def test_transient_start_failures_are_retried(make_executor: ExecutorFactory) -> None:
    backend = _FlakyBackend(2, TransientBackendError)
    ex = make_executor(1, backend=backend, start_retry=FAST_RETRY)
    assert ex.submit(tasks.square, 3).result(timeout=30) == 9
    assert backend.calls == 3


def test_permanent_start_failure_breaks_executor_at_once(make_executor: ExecutorFactory) -> None:
    backend = _FlakyBackend(100, PermanentBackendError)
    ex = make_executor(1, backend=backend, start_retry=FAST_RETRY)
    with pytest.raises(Exception, match="could not start a worker.*simulated failure 1"):
        ex.submit(tasks.square, 3).result(timeout=30)
    assert backend.calls == 1


def test_exhausted_transient_failures_break_executor(make_executor: ExecutorFactory) -> None:
    backend = _FlakyBackend(100, TransientBackendError)
    ex = make_executor(1, backend=backend, start_retry=FAST_RETRY)
    with pytest.raises(Exception, match="could not start a worker.*simulated failure 4"):
        ex.submit(tasks.square, 3).result(timeout=30)


def test_worker_that_cannot_start_breaks_with_its_output(make_executor: ExecutorFactory) -> None:
    backend = LocalBackend(python="/bin/false", capture_output=True)
    try:
        ex = make_executor(1, backend=backend)
        with pytest.raises(Exception,
                           match="3 workers in a row failed to start.*exited with code 1"):
            ex.submit(tasks.square, 3).result(timeout=60)
        ex.shutdown()
    finally:
        backend.close()  # the caller's backend: the executor leaves it open (its log files)


def test_task_arriving_as_the_executor_breaks_still_fails(make_executor: ExecutorFactory) -> None:
    """The first start fails at once, possibly before the task reaches its shard."""
    for _ in range(20):
        backend = _FlakyBackend(100, PermanentBackendError)
        ex = make_executor(1, backend=backend, start_retry=FAST_RETRY)
        with pytest.raises(Exception, match="could not start a worker"):
            ex.submit(tasks.square, 3).result(timeout=30)
