"""A job killed by its time limit, started with the session and checked at its end.

Slurm's time limits are whole minutes, which slurmctld checks about every 30 s: such a job
ends 60 to 95 s after it starts. Its test (`TIME_LIMIT_TEST`) would spend all of that
waiting, so the job starts before the first test here and the test runs last: the wait
overlaps the rest of the run. The job is named for an executor of its own, which the leak
check leaves alone while it is reserved (`backend_slurm.RESERVED`); the session's end
cancels it whatever happened.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.slurm.test_slurm_backend import SLEEP, Exits, _spec
from tests.support import backend_slurm
from tests.support.kit import BackendKit

TIME_LIMIT_TEST = "test_job_killed_by_its_time_limit_is_reported_timeout"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The time-limit test runs last, when its job has long reached its limit."""
    last = [item for item in items if item.name == TIME_LIMIT_TEST]
    items[:] = [item for item in items if item.name != TIME_LIMIT_TEST] + last


@pytest.fixture(scope="session", autouse=True)
def time_limited_job(request: pytest.FixtureRequest,
                     kit: BackendKit) -> Iterator[Exits | None]:
    """Where the exit of a worker job ``w0`` with a one-minute limit is reported: started
    before the first test of this folder, if the time-limit test is to run."""
    if not any(item.name == TIME_LIMIT_TEST for item in request.session.items):
        yield None
        return
    # squeue every 5 s is enough to see the end: this backend watches the whole run
    backend = kit.make_backend(time_limit=1, poll_interval=5.0)  # type: ignore[call-arg]
    executor = secrets.token_hex(4)
    backend_slurm.RESERVED.add(executor)
    try:
        exits = Exits()
        handle = backend.start_worker(_spec(executor, "w0", SLEEP))
        backend.watch(handle, exits)
        yield exits
    finally:
        backend.close()
        backend_slurm.RESERVED.discard(executor)
