"""Workers that cannot start break the executor only when none is serving."""

from __future__ import annotations

import itertools

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from tests import tasks

FAILING = ("python", "-c", "raise SystemExit(3)")


class FirstWorksBackend(LocalBackend):
    """The first ``good`` workers start for real; every later one exits before connecting."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self._count = itertools.count()
        self.good = good

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        if next(self._count) >= self.good:
            spec = WorkerSpec(spec.worker_id, spec.executor_id, FAILING, spec.env,
                              spec.secret_env)
        return super().start_worker(spec)


def test_failing_starts_do_not_break_an_executor_that_is_serving() -> None:
    with FirstWorksBackend(good=1) as backend, \
            FiberExecutor(3, min_workers=1, backend=backend) as ex:
        assert ex.submit(tasks.square, 2).result(timeout=60) == 4  # the good one serves
        results = list(ex.map(tasks.sleep_return, [0.02] * 30, range(30), timeout=60))
        assert results == list(range(30))
        assert ex.stats().workers == 1
        assert not ex._broken


def test_failing_starts_break_an_executor_with_no_worker() -> None:
    with FirstWorksBackend(good=0) as backend, FiberExecutor(2, backend=backend) as ex:
        future = ex.submit(tasks.square, 2)
        with pytest.raises(BrokenFiberExecutor, match="failed to start"):
            future.result(timeout=60)
