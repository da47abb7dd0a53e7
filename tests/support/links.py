"""An in-memory link pair with the seam's interface (`fiberexec._link`), for unit tests.

`MemoryEndpoint` is the executor's end (readable ``fileno()`` while frames wait, sends that
never block up to ``capacity`` queued frames); `MemoryLink` is the worker's end. Both run the
link conformance checks of ``tests/test_links.py``, like the real links.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from fiberexec._errors import LinkClosed, ProtocolError
from fiberexec._link import Received

_ids = itertools.count(1)


class MemoryPipe:
    def __init__(self, endpoint: MemoryEndpoint) -> None:
        self.id = next(_ids)
        self.endpoint = endpoint
        self.to_worker: deque[bytes] = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.worker_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # frames wait

    def signal(self) -> None:
        """(Holding ``cond``) a frame or the hang-up waits for the worker."""
        if self.worker_fd >= 0:
            os.eventfd_write(self.worker_fd, 1)

    def close(self) -> None:
        self.endpoint.hang_up(self)


class MemoryEndpoint:
    kind = "memory"

    def __init__(self, on_remove: Callable[[Any], None], capacity: int = 1024) -> None:
        self.on_remove = on_remove
        self.capacity = capacity
        self.closed = False
        self.bound: MemoryPipe | None = None
        self.sealed = False
        self._inbox: deque[Received] = deque()
        self._lock = threading.Lock()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def connect(self) -> MemoryLink:
        if self.closed or self.sealed:
            raise ConnectionRefusedError("the endpoint takes no new peer")
        return MemoryLink(MemoryPipe(self))

    def fileno(self) -> int:
        return self._fd

    def deliver(self, frame: bytes, pipe: MemoryPipe) -> None:
        with self._lock:
            if self.closed:
                raise LinkClosed("the executor's end is closed")
            self._inbox.append(Received(frame, pipe))
            os.eventfd_write(self._fd, 1)

    def try_recv(self) -> Received | None:
        with self._lock:
            if self._inbox:
                return self._inbox.popleft()
            try:
                os.eventfd_read(self._fd)
            except BlockingIOError:
                pass
            return None

    def bind(self, pipe: Any) -> None:
        self.bound = pipe

    def seal(self) -> None:
        self.sealed = True

    def send_nowait(self, frame: bytes) -> None:
        pipe = self.bound
        if pipe is None or pipe.closed:
            raise ProtocolError("the worker's connection is closed")
        with pipe.cond:
            if len(pipe.to_worker) >= self.capacity:
                raise ProtocolError("peer is not reading: its send queue is full")
            pipe.to_worker.append(frame)
            pipe.signal()
            pipe.cond.notify()

    def take_in(self) -> None:
        """(What a peer sends waits in the inbox: nothing to read.)"""

    @property
    def peer_gone(self) -> bool:
        pipe = self.bound
        return pipe is None or pipe.closed

    def peer_cpu(self) -> float | None:
        return None  # (judged as a network link)

    def hang_up(self, pipe: MemoryPipe) -> None:
        with pipe.cond:
            was_open, pipe.closed = not pipe.closed, True
            pipe.signal()
            pipe.cond.notify_all()
        if was_open and not self.closed:
            self.on_remove(pipe)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bound is not None:
            with self.bound.cond:
                self.bound.closed = True
                self.bound.signal()
                self.bound.cond.notify_all()
        os.close(self._fd)


class MemoryLink:
    """The worker's end of a `MemoryEndpoint`."""

    kind = "memory"

    def __init__(self, pipe: MemoryPipe) -> None:
        self.pipe = pipe
        self.closed = False

    def recv(self, timeout: float) -> bytes | None:
        with self.pipe.cond:
            self.pipe.cond.wait_for(lambda: self.pipe.to_worker or self.pipe.closed, timeout)
            return self._take()

    def try_recv(self) -> bytes | None:
        with self.pipe.cond:
            return self._take()

    buffered = try_recv

    def fileno(self) -> int:
        return self.pipe.worker_fd

    def _take(self) -> bytes | None:
        if self.pipe.to_worker:
            frame = self.pipe.to_worker.popleft()
            if not self.pipe.to_worker and not self.pipe.closed:
                os.eventfd_read(self.pipe.worker_fd)  # nothing waits any more
            return frame
        if self.pipe.closed:
            raise LinkClosed("the connection to the executor closed")
        return None

    def send(self, frame: bytes, timeout: float) -> None:
        if self.pipe.closed:
            raise LinkClosed("the connection to the executor closed")
        self.pipe.endpoint.deliver(frame, self.pipe)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pipe.close()
            with self.pipe.cond:
                fd, self.pipe.worker_fd = self.pipe.worker_fd, -1
            os.close(fd)
