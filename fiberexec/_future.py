"""A task's future: pending while it waits at a worker, and cancelled only if it never runs.

A worker is sent known short tasks ahead, to wait behind the one it runs (so that it never
idles for a round trip). Such a task has not started: its future stays pending, as a task
still queued in the executor does. It can start at any moment, though, once the task before
it ends. So `TaskFuture.cancel` asks: the shard holding it asks its worker for it back
(``Revoke``), and the call returns True only if the worker gave it back unstarted. A
cancelled call never runs, as with the standard library, whose call queue holds only tasks
already marked running.

The question takes one round trip to the worker (answered while it runs a task: see
`fiberexec.worker.Watcher`), at most `CANCEL_WAIT`; without an answer by then, or when asked
from the shard's own thread (a done-callback cancelling another future), `cancel` returns
False and the task runs, as a running one would.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

CANCEL_WAIT = 2.0  # seconds `cancel` waits for the worker holding a task to answer


class Holder(Protocol):
    def ask_back(self, key: object, future: TaskFuture[Any]) -> bool:
        """Get the task back from its worker and cancel it; True if that was done."""


class TaskFuture(Future[T]):
    """The future `FiberExecutor.submit` returns."""

    _held: tuple[Holder, object] | None = None  # who holds it at a worker, and its key there

    def cancel(self) -> bool:
        with self._condition:
            held = self._held
            if held is None or self.done():  # (a held task failed with its executor)
                return super().cancel()
        holder, key = held
        return holder.ask_back(key, self)

    def set_running_or_notify_cancel(self) -> bool:
        with self._condition:
            self._held = None  # it runs (or was cancelled): nothing to ask for any more
            return super().set_running_or_notify_cancel()

    # ------------------------------------------------------------ for the shard

    def hold(self, holder: Holder, key: object) -> bool:
        """It is sent to wait at a worker; False if it was cancelled meanwhile."""
        with self._condition:
            if self.cancelled():
                return False
            self._held = (holder, key)
            return True

    def release(self) -> None:
        """It is back in the executor's queue (given back, or its worker was lost)."""
        with self._condition:
            self._held = None

    @property
    def holding(self) -> tuple[Holder, object] | None:
        """Who holds it at a worker, and its key there (None: nobody)."""
        return self._held

    def cancel_unheld(self) -> bool:
        """Cancel it as the standard library would, now that no worker holds it."""
        with self._condition:
            self._held = None
            return super().cancel()


class Answer:
    """One `cancel` call waiting for the shard's answer; the shard acts only while the
    caller still waits (a late answer leaves the task to run, as `cancel` then said)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._waiting = True
        self._ok = False

    def wait(self, timeout: float) -> bool:
        self._done.wait(timeout)
        with self._lock:
            self._waiting = False
            return self._ok

    def give(self, ok: bool) -> None:
        with self._lock:
            self._ok = ok and self._waiting
            self._done.set()

    def cancel(self, future: TaskFuture[Any]) -> bool:
        """Cancel ``future`` if the caller still waits; True if it did."""
        with self._lock:
            if self._waiting:
                self._ok = future.cancel_unheld()
            self._done.set()
            return self._ok
