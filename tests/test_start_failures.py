"""Workers that cannot start break the executor only when none is serving."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor, RetryPolicy
from fiberexec.backend import TransientBackendError, WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from tests import tasks

FAILING = ("python", "-c", "raise SystemExit(3)")


class FirstWorksBackend(LocalBackend):
    """The first ``good`` workers start for real; every later one exits before connecting."""

    def __init__(self, good: int, failing: tuple[str, ...] = FAILING) -> None:
        super().__init__()
        self._count = itertools.count()
        self.good = good
        self.failing = failing

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        if next(self._count) >= self.good:
            spec = WorkerSpec(spec.worker_id, spec.executor_id, self.failing, spec.env,
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


class NoLogsBackend(FirstWorksBackend):
    """Every worker exits before connecting, and asking for its log fails (an engine that
    cannot say)."""

    def __init__(self) -> None:
        super().__init__(good=0)

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        raise RuntimeError("the engine cannot say")


def test_a_backend_that_cannot_give_a_failed_workers_log_still_breaks_the_executor() -> None:
    with NoLogsBackend() as backend, FiberExecutor(2, backend=backend) as ex:
        future = ex.submit(tasks.square, 2)
        with pytest.raises(BrokenFiberExecutor, match="failed to start; the last: worker w"):
            future.result(timeout=60)


@pytest.mark.parametrize("output", ["inherit", "off"])
def test_a_start_failure_says_where_the_workers_output_went(
        output: str, capfd: pytest.CaptureFixture[str]) -> None:
    """What a worker wrote before it connected is the backend's (here: this program's
    stderr, whatever ``output`` says of tasks' prints), and the error says where."""
    failing = ("python", "-c", "import sys; sys.exit('no module named nothing')")
    with FirstWorksBackend(good=0, failing=failing) as backend, \
            FiberExecutor(2, backend=backend, output=output) as ex:
        future = ex.submit(tasks.square, 2)
        with pytest.raises(BrokenFiberExecutor) as broken:
            future.result(timeout=60)
    assert str(broken.value).endswith(
        "exited with code 1 before connecting to the executor; what it wrote before it "
        "connected went to this program's stderr")
    assert "no module named nothing" in capfd.readouterr().err


def test_submit_never_waits_for_a_worker_to_start() -> None:
    """Workers start in the background: a backend that takes its time holds up no caller."""
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


class LostHostBackend(LocalBackend):
    """Its first two workers start for real; of the later starts, the first fails at once
    and every other blocks until the test opens ``gate`` (a host that does not answer), then
    fails. ``called`` is set by every later start."""

    def __init__(self) -> None:
        super().__init__()
        self.handles: list[WorkerHandle] = []
        self.gate = threading.Event()
        self.called = threading.Event()
        self.calls = 0
        self._count = threading.Lock()

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        with self._count:
            number, self.calls = self.calls, self.calls + 1
        if number < 2:
            handle = super().start_worker(spec)
            self.handles.append(handle)
            return handle
        self.called.set()
        if number > 2:
            self.gate.wait(120)
        raise TransientBackendError("cannot reach host h1: connection timed out")


class Connected(logging.Handler):
    """Set once ``count`` workers have connected (the executor logs each at INFO)."""

    def __init__(self, count: int) -> None:
        super().__init__(logging.INFO)
        self.count, self.all = count, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if " connected (" in record.getMessage():
            self.count -= 1
            if self.count <= 0:
                self.all.set()


@pytest.fixture
def connected() -> Iterator[Connected]:
    logger = logging.getLogger("fiberexec")
    level, handler = logger.level, Connected(2)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_losing_every_worker_breaks_with_the_start_failure_and_starts_nothing_more(
    connected: Connected,
) -> None:
    """Every worker lost, every start failing or hanging: the executor breaks with the
    start's cause once ``deadline_without_workers`` has passed (not after the full retry
    deadline), its shutdown does not wait for the hanging starts, and none is retried."""
    backend = LostHostBackend()
    policy = RetryPolicy(deadline_without_workers=0.5, initial=0.01, maximum=0.05)
    ex = FiberExecutor(2, backend=backend, start_retry=policy, max_task_retries=5)
    try:
        futures = [ex.submit(tasks.sleep_return, 60, i) for i in range(2)]
        assert connected.all.wait(60), "the two workers did not connect"
        for handle in list(backend.handles):
            backend.signal(handle, signal.SIGKILL)
        with pytest.raises(BrokenFiberExecutor) as caught:
            futures[0].result(timeout=30)  # the full retry deadline is 60 s
        assert "cannot reach host h1" in str(caught.value)
        assert "deadline_without_workers" in str(caught.value)
        assert isinstance(caught.value.__cause__, TransientBackendError)
        closing = threading.Thread(target=ex.shutdown, kwargs={"wait": True})
        closing.start()
        closing.join(timeout=15)
        assert not closing.is_alive(), "shutdown waited for starts to a host that never answers"
        backend.called.clear()
        backend.gate.set()  # the hanging starts fail now: none may be tried again
        assert not backend.called.wait(1.0), "a broken executor retried a start"
    finally:
        backend.gate.set()
        ex.shutdown(wait=True)
        backend.close()


def test_a_start_abandoned_before_its_first_attempt_makes_none() -> None:
    """A start that reaches the backend after the executor broke (its check passed just
    before) is not made: the retry policy tries nothing once ``abandon`` is set."""
    from fiberexec._retry import Abandoned

    calls: list[int] = []
    halted = threading.Event()
    halted.set()
    with pytest.raises(Abandoned, match="before its first attempt"):
        RetryPolicy().call(lambda: calls.append(1), abandon=halted)
    assert calls == []


def _listening(prefix: str) -> list[str]:
    """Abstract Unix sockets of this process whose names start with ``prefix``."""
    with open("/proc/net/unix") as table:
        return [line.split()[-1] for line in table if line.split()[-1].startswith(prefix)]


def test_a_start_that_fails_after_shutdown_leaves_no_endpoint_open() -> None:
    """The endpoint of a worker whose start is still under way when the shards close is
    left for that start to close (so that a worker it does start never finds it gone):
    a start that then fails closes it too."""

    class GatedBackend(LocalBackend):
        def __init__(self) -> None:
            super().__init__()
            self.count = itertools.count()
            self.held = threading.Event()
            self.gate = threading.Event()

        def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
            if next(self.count) == 0:
                return super().start_worker(spec)
            self.held.set()
            assert self.gate.wait(60), "the test never let the start go on"
            raise TransientBackendError("the host went away")

    backend = GatedBackend()
    ex = FiberExecutor(2, min_workers=2, backend=backend)
    try:
        assert ex.submit(abs, -1).result(timeout=60) == 1
        assert backend.held.wait(30)  # the second start is under way, held
        prefix = f"@fiberexec/{os.getpid()}/{ex.executor_id}/"  # type: ignore[union-attr]
        assert _listening(prefix)
        closing = threading.Thread(target=ex.shutdown, kwargs={"wait": True})
        closing.start()
        assert ex._pool.supervisor._halt.wait(30)  # type: ignore[union-attr]  # stop_all ran
        backend.gate.set()  # the start fails after the shards have closed
        closing.join(60)
        assert not closing.is_alive()
        assert _listening(prefix) == []
    finally:
        backend.gate.set()
        ex.shutdown(wait=True)
        backend.close()
