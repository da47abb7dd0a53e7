"""Collects `start_worker` calls that arrive close together, so they become one job array.

The executor asks for workers one at a time, from a few launcher threads. `Batcher.add`
returns at once; one thread waits ``window`` seconds after the first item of a batch (or
until ``limit`` items are queued), then hands the whole batch to ``submit``. So a burst of
1024 requests becomes ``ceil(1024 / limit)`` submissions, not 1024.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batcher(Generic[T]):
    """One background thread turning a stream of items into batches for ``submit``."""

    def __init__(self, submit: Callable[[list[T]], None], *, window: float, limit: int,
                 name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._submit = submit
        self._window = window
        self._limit = limit
        self._clock = clock
        self._items: list[T] = []
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def add(self, item: T) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("Batcher.add after close()")
            self._items.append(item)
            if not self._started:
                self._started = True
                self._thread.start()
            self._cond.notify()

    def discard(self, item: T) -> bool:
        """Take ``item`` out if it is still waiting; True if it was."""
        with self._cond:
            if item in self._items:
                self._items.remove(item)
                return True
            return False

    def _next_batch(self) -> list[T] | None:
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = self._clock() + self._window
            while len(self._items) < self._limit and not self._closed:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._closed:
                return None
            batch, self._items = self._items[: self._limit], self._items[self._limit :]
            return batch

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:  # closed
                return
            self._submit(batch)

    def close(self, timeout: float = 60.0) -> list[T]:
        """Stop; wait for a submission in progress; return the items never submitted."""
        with self._cond:
            self._closed = True
            left, self._items = self._items, []
            self._cond.notify_all()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return left
