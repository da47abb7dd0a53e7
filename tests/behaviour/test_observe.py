"""Seeing what workers do, on every backend: workers(), dump_stack(), spans and failures."""

from __future__ import annotations

import time

import pytest

from fiberexec import BrokenFiberExecutor
from tests import tasks
from tests.conftest import ExecutorFactory


def test_workers_and_dump_stack_show_the_running_task(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert ex.submit(tasks.square, 2).result(timeout=120) == 4
    (worker,) = ex.workers()
    assert (worker.state, worker.tasks_done, worker.task) == ("idle", 1, None)
    assert worker.host and worker.reference and worker.rss_bytes
    future = ex.submit(tasks.sleep_return, 120, "late")
    # The first ask may reach the worker with the task, before it starts: ask again then.
    deadline = time.monotonic() + 60
    stack = ""
    while "sleep_return" not in stack:
        assert time.monotonic() < deadline, f"the task never showed in the stack:\n{stack}"
        stack = ex.dump_stack(worker.worker_id, timeout=30)
    (worker,) = ex.workers()
    assert worker.state == "running" and worker.task is not None
    assert (worker.task.function, worker.task.arguments) == (
        "tests.tasks.sleep_return", "120, 'late'")
    assert worker.task.started <= time.time()
    ex.terminate()  # not waiting out the task
    with pytest.raises(BrokenFiberExecutor):
        future.result(timeout=60)


def test_spans_and_failures_come_back_from_any_backend(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert ex.submit(tasks.add, 1, b=2).result(timeout=120) == 3
    with pytest.raises(ValueError, match="no good"):
        ex.submit(tasks.raise_value_error, "no good").result(timeout=60)
    assert [(s.function, s.ok) for s in ex.task_spans()] == [
        ("tests.tasks.add", True), ("tests.tasks.raise_value_error", False)]
    (failure,) = ex.failures()
    assert failure.error == "ValueError: no good" and failure.arguments == "'no good'"
    assert "raise_value_error" in failure.traceback
    (worker,) = ex.workers()
    assert (worker.tasks_done, worker.tasks_failed, failure.worker_id) == (1, 1, worker.worker_id)


def test_task_output_reaches_this_process_prefixed_by_worker_and_host(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str]) -> None:
    ex = make_executor(1, output="forward")
    assert ex.submit(tasks.chatter, 50, 1).result(timeout=120) == 1
    (worker,) = ex.workers()
    ex.shutdown()
    out, err = capfd.readouterr()
    prefix = f"[{worker.worker_id} {worker.host}] "
    assert [line for line in out.splitlines() if line.startswith(prefix)] == [
        f"{prefix}line {i}" for i in range(50)]
    assert f"{prefix}to stderr" in err.splitlines()
