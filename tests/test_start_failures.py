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


def test_submit_never_waits_for_a_worker_to_start() -> None:
    """Workers start in the background: a backend that takes its time holds up no caller."""
    import threading

    from fiberexec import FiberExecutor
    from fiberexec.backends.local import LocalBackend

    class SlowBackend(LocalBackend):
        def __init__(self) -> None:
            super().__init__()
            self.gate = threading.Event()
            self.asked = threading.Semaphore(0)

        def start_worker(self, spec):  # type: ignore[no-untyped-def]
            self.asked.release()
            assert self.gate.wait(60), "the test never let the start go on"
            return super().start_worker(spec)

    backend = SlowBackend()
    try:
        with FiberExecutor(4, backend=backend) as ex:
            future = ex.submit(abs, -3)  # returns while every start is held at the gate
            futures = [ex.submit(abs, -i) for i in range(20)]
            assert backend.asked.acquire(timeout=30)  # a start is under way, and blocked
            assert not future.done()
            backend.gate.set()
            assert future.result(timeout=60) == 3
            assert [f.result(timeout=60) for f in futures] == list(range(20))
    finally:
        backend.gate.set()
        backend.close()
