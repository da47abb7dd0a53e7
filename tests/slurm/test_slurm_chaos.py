"""Chaos on the real cluster: scancel mid-map, a time limit, a job over its memory."""

from __future__ import annotations

import subprocess
import threading

import pytest

from fiberexec import Stats, WorkerLostError
from fiberexec.backend import WorkerState
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.slurm import slurm_tasks
from tests.slurm.test_slurm_backend import Exits
from tests.support.backend_slurm import jobs


def _running_tasks(executor: str) -> list[str]:
    return [f"{j['array_job_id']}_{j['array_task_id']}" for j in jobs()
            if j["name"] == f"fiberexec-{executor}" and j["job_state"] == "RUNNING"]


@pytest.mark.chaos
def test_scancel_of_a_busy_worker_mid_map_loses_nothing(make_executor: ExecutorFactory) -> None:
    both_ready = threading.Event()

    def progress(stats: Stats) -> None:
        if stats.workers == 2:
            both_ready.set()

    ex = make_executor(2, progress=progress)
    results = ex.map(tasks.sleep_return, [0.1] * 100, range(100), timeout=120)
    # A job Slurm calls RUNNING may still be starting Python: cancel one that has connected.
    assert both_ready.wait(60), f"the second worker never connected: {ex.stats()}"
    executor = ex.executor_id
    victim = _running_tasks(executor)[0]
    subprocess.run(["scancel", victim], check=True, timeout=30)
    assert list(results) == list(range(100)), "results must be complete and in order"
    stats = ex.stats()
    assert stats.workers_lost >= 1 and stats.tasks_failed == 0


@pytest.mark.chaos
def test_job_over_its_memory_is_named_out_of_memory(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, memory="150M", max_task_retries=0)
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9  # fits: the worker is fine
    with pytest.raises(WorkerLostError, match="OUT_OF_MEMORY") as caught:
        ex.submit(slurm_tasks.hog_memory, 600).result(timeout=90)
    assert "killed by signal 9" in str(caught.value)


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_job_killed_by_its_time_limit_is_reported_timeout(
        time_limited_job: Exits | None) -> None:
    """A job Slurm kills at its time limit is reported as exited for ``TIMEOUT``, by a
    signal. Slurm's unit is the minute, checked about every 30 s: the job takes 60 to 95 s,
    so it starts with the session and this test runs last (see ``conftest.py``)."""
    assert time_limited_job is not None
    status = time_limited_job.wait("w0", 200)
    assert (status.state, status.reason) == (WorkerState.EXITED, "TIMEOUT")
    assert status.exit_code is not None and status.exit_code < 0, status
