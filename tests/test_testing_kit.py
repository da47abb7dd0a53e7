"""The conformance kit fails backends that break the contract (a check that cannot fail
checks nothing): each case is the local backend with one rule broken."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

import psutil
import pytest

from fiberexec.backend import ExitListener, Sweep, WorkerHandle, WorkerState, WorkerStatus
from fiberexec.backends._local_stray import local_workers
from fiberexec.backends.local import LocalBackend
from fiberexec.testing import CHECKS, Harness


class ShellExitCodes(LocalBackend):
    """Reports death by signal N as 128 + N, as a shell would."""

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        def as_shell(h: WorkerHandle, status: WorkerStatus) -> None:
            code = status.exit_code
            if code is not None and code < 0:
                status = WorkerStatus(status.state, exit_code=128 - code)
            listener(h, status)

        super().watch(handle, as_shell)


class ReportsTwice(LocalBackend):
    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        super().watch(handle, lambda h, status: (listener(h, status), listener(h, status)))


class GuessesUnknown(LocalBackend):
    def status(self, handle: WorkerHandle) -> WorkerStatus:
        found = super().status(handle)
        return WorkerStatus(WorkerState.EXITED, 0) if found.state is WorkerState.UNKNOWN else found


class ReportsStops(LocalBackend):
    """Tells the listener about a deliberate stop, as if the worker had died."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[str, ExitListener] = {}

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        self.listeners[handle.worker_id] = listener
        super().watch(handle, listener)

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        listener = self.listeners.pop(handle.worker_id, None)
        super().stop(handle, grace=grace)
        if listener is not None:
            listener(handle, WorkerStatus(WorkerState.EXITED, exit_code=-15))


class LeavesWorkersOnClose(LocalBackend):
    """close() forgets its workers instead of stopping them (they are stopped by the test)."""

    left: ClassVar[list[LocalBackend]] = []

    def close(self) -> None:
        LeavesWorkersOnClose.left.append(self)


class IgnoresLeases(LocalBackend):
    """A bare sweep removes every worker of this program, live executors' too. (Only this
    program's: the local env runs another test process beside this one, whose workers a
    machine-wide sweep would remove as well.)"""

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        if sweep.executor_id is not None or sweep.everything:
            return super().remove_stray(sweep)
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        executors = {w.executor_id for w in local_workers() if w.pid in ours and w.executor_id}
        lines = []
        for executor in sorted(executors):
            lines += super().remove_stray(replace(sweep, executor_id=executor))
        return lines


BROKEN: dict[str, Callable[[], LocalBackend]] = {
    "exit_codes": ReportsTwice,
    "watch_reports_once": ReportsTwice,
    "signals": ShellExitCodes,
    "unknown_handle": GuessesUnknown,
    "stop": ReportsStops,
    "close": LeavesWorkersOnClose,
    "remove_stray": IgnoresLeases,
    "logs": LocalBackend,  # without capture_output=True it keeps no output
}


def test_every_check_has_a_broken_backend() -> None:
    assert set(BROKEN) == set(CHECKS)


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_check_fails_a_backend_that_breaks_its_rule(check: str) -> None:
    harness = Harness(make_backend=BROKEN[check], timeout=5.0)
    try:
        with pytest.raises(AssertionError):
            CHECKS[check](harness)
    finally:
        for backend in LeavesWorkersOnClose.left:
            LocalBackend.close(backend)
        LeavesWorkersOnClose.left.clear()


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_check_passes_the_local_backend(check: str) -> None:
    CHECKS[check](Harness(make_backend=lambda: LocalBackend(capture_output=True)))

