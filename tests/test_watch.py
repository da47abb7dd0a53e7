"""`ExitWatch`, the table backends compose to report each worker's exit once."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from fiberexec.backend import (
    Backend,
    ExitWatch,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)

EXITED = WorkerStatus(WorkerState.EXITED, exit_code=3)
RUNNING = WorkerStatus(WorkerState.RUNNING)


class _Reports:
    """A listener that records every call."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[WorkerHandle, WorkerStatus]] = queue.Queue()

    def __call__(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        self.calls.put((handle, status))

    def all(self) -> list[tuple[WorkerHandle, WorkerStatus]]:
        return [self.calls.get_nowait() for _ in range(self.calls.qsize())]


def _race(exits: ExitWatch, handle: WorkerHandle) -> list[bool]:
    """Two threads report ``handle``'s exit at the same moment; what each `report` said."""
    gate = threading.Barrier(2)
    delivered: list[bool] = []

    def report() -> None:
        gate.wait()
        delivered.append(exits.report(handle, EXITED))

    threads = [threading.Thread(target=report) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return delivered


def test_two_threads_reporting_the_same_exit_deliver_it_once() -> None:
    for round_ in range(200):
        exits, reports = ExitWatch(), _Reports()
        handle = WorkerHandle(f"w{round_}", "1")
        exits.watch(handle, reports)
        assert sorted(_race(exits, handle)) == [False, True]
        assert reports.all() == [(handle, EXITED)]


def test_report_gives_the_listener_the_watched_handle_once() -> None:
    exits, reports = ExitWatch(key=lambda h: h.ref), _Reports()
    watched = WorkerHandle("w1", "pod-a")
    exits.watch(watched, reports)
    assert exits.get("pod-a") is watched and exits.get("w1") is None
    assert exits.report(WorkerHandle("other-id", "pod-a"), EXITED)  # keyed by pod name
    assert not exits.report(watched, EXITED)
    assert reports.all() == [(watched, EXITED)]
    assert exits.keys() == []


def test_unwatch_then_report_delivers_nothing() -> None:
    exits, reports = ExitWatch(), _Reports()
    handle = WorkerHandle("w1", "1")
    exits.watch(handle, reports)
    exits.unwatch(handle)
    exits.unwatch(handle)  # again: a no-op
    assert not exits.report(handle, EXITED)
    assert reports.all() == []


def test_clear_returns_what_remained_and_reports_nothing() -> None:
    exits, reports = ExitWatch(), _Reports()
    handles = [WorkerHandle(f"w{i}", str(i)) for i in range(3)]
    for handle in handles:
        exits.watch(handle, reports)
    exits.report(handles[1], EXITED)
    assert sorted(exits.keys()) == ["w0", "w2"]
    assert sorted(exits.clear(), key=lambda h: h.worker_id) == [handles[0], handles[2]]
    assert exits.clear() == []
    assert not exits.report(handles[0], EXITED)
    assert reports.all() == [(handles[1], EXITED)]


def test_polling_reports_a_finished_status_and_stops_within_its_timeout() -> None:
    exits, reports = ExitWatch(), _Reports()
    done, polled = threading.Event(), threading.Event()
    finishing, running = WorkerHandle("finishing", "1"), WorkerHandle("running", "2")

    def status(handle: WorkerHandle) -> WorkerStatus:
        polled.set()
        return EXITED if handle is finishing and done.is_set() else RUNNING

    exits.watch(finishing, reports)
    exits.watch(running, reports)
    exits.poll(status, interval=0.01, name="test-watch")
    exits.poll(status, interval=0.01, name="test-watch")  # again: still one thread
    assert [t.name for t in threading.enumerate()].count("test-watch") == 1
    assert polled.wait(10)
    assert reports.calls.empty()  # both running: nothing reported
    done.set()
    assert reports.calls.get(timeout=10) == (finishing, EXITED)
    assert exits.keys() == ["running"]
    started = time.monotonic()
    assert exits.stop_polling(timeout=5)
    assert time.monotonic() - started < 5
    assert "test-watch" not in [t.name for t in threading.enumerate()]
    exits.poll(status, interval=0.01, name="test-watch")  # stopped for good
    assert "test-watch" not in [t.name for t in threading.enumerate()]
    assert reports.calls.empty()


def test_stop_polling_gives_up_after_its_timeout_on_a_stuck_status() -> None:
    exits, release, entered = ExitWatch(), threading.Event(), threading.Event()

    def stuck(handle: WorkerHandle) -> WorkerStatus:
        entered.set()
        release.wait(30)
        return RUNNING

    exits.watch(WorkerHandle("w1", "1"), _Reports())
    exits.poll(stuck, interval=0.01, name="test-stuck-watch")
    assert entered.wait(10)
    started = time.monotonic()
    assert not exits.stop_polling(timeout=0.2)
    assert time.monotonic() - started < 5
    release.set()
    assert exits.stop_polling(timeout=10)


def test_stop_polling_without_a_thread_is_done() -> None:
    assert ExitWatch().stop_polling(timeout=0)


def test_a_backend_without_watch_is_told_to_compose_exit_watch() -> None:
    class Forgetful(Backend):  # a third-party backend written before watch was required
        def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
            raise NotImplementedError

        def status(self, handle: WorkerHandle) -> WorkerStatus:
            return RUNNING

        def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
            pass

        def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
            return ""

    with pytest.raises(TypeError, match=r"Forgetful does not implement Backend\.unwatch\(\) "
                                        r"and Backend\.watch\(\); compose a "
                                        r"fiberexec\.backend\.ExitWatch"):
        Forgetful()
