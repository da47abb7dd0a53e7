"""An in-memory stream socket pair, for the multiprocessing layer's connections (`Wire`,
`Reader` of `fiberexec.multiprocessing._links`) in unit tests.

`memory_pair()` returns two `MemorySocket`s with what the layer uses of a connected stream
socket: ``sendall``, blocking ``recv`` and ``recv_into``, ``shutdown``, ``close`` and a
``fileno()`` that is readable exactly while bytes wait or the stream has ended (an eventfd,
so ``poll`` and ``epoll`` watch it as they watch a socket). Bytes arrive in order, in
whatever pieces the reader asks for; ``shutdown`` ends the stream both ways, waking a thread
blocked reading either end; a send to an end that is gone raises `BrokenPipeError`. The
tests of ``tests/mp/test_links.py`` run on it as on Unix and TCP sockets.
"""

from __future__ import annotations

import os
import socket
import threading


class MemorySocket:
    def __init__(self, lock: threading.Lock) -> None:
        self._cond = threading.Condition(lock)  # (one lock for both ends)
        self._inbox = bytearray()
        self._ended = False  # nothing more will arrive (the peer or we shut down)
        self._readable = False  # the eventfd's counter is set
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.peer: MemorySocket | None = None
        self.closed = False

    def _mark(self) -> None:
        """(Holding the lock) make ``fileno()`` readable exactly while a read would not
        block, and wake a blocked reader."""
        ready = bool(self._inbox) or self._ended
        if ready and not self._readable and not self.closed:
            os.eventfd_write(self._fd, 1)
        elif not ready and self._readable and not self.closed:
            os.eventfd_read(self._fd)
        self._readable = ready
        self._cond.notify_all()

    def fileno(self) -> int:
        if self.closed:
            return -1
        return self._fd

    def settimeout(self, timeout: float | None) -> None:
        if timeout is not None:
            raise NotImplementedError("the layer's connections block without a timeout")

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        with self._cond:
            peer = self.peer
            if self.closed or self._ended or peer is None or peer._ended or peer.closed:
                raise BrokenPipeError("the other end of the in-memory stream is gone")
            peer._inbox += data
            peer._mark()

    def _take(self, size: int) -> bytes:
        """(Holding the lock) up to ``size`` bytes, waiting for at least one; b"" at the
        end."""
        while not self._inbox and not self._ended:
            if self.closed:
                raise OSError("the in-memory socket is closed")
            self._cond.wait()
        data = bytes(self._inbox[:size])
        del self._inbox[:size]
        self._mark()
        return data

    def recv(self, size: int, flags: int = 0) -> bytes:
        if flags:
            raise NotImplementedError(f"recv flags {flags} on an in-memory socket")
        with self._cond:
            return self._take(size)

    def recv_into(self, view: memoryview, size: int = 0, flags: int = 0) -> int:
        data = self.recv(size or len(view), flags)
        view[: len(data)] = data
        return len(data)

    def shutdown(self, how: int) -> None:
        if how != socket.SHUT_RDWR:
            raise NotImplementedError("only SHUT_RDWR, as the layer uses")
        with self._cond:
            self._ended = True
            self._mark()
            if self.peer is not None:
                self.peer._ended = True
                self.peer._mark()

    def close(self) -> None:
        with self._cond:
            if self.closed:
                return
            if self.peer is not None:  # a close with nothing shut down still ends it there
                self.peer._ended = True
                self.peer._mark()
            self.closed = True
            self._cond.notify_all()
        os.close(self._fd)


def memory_pair() -> tuple[MemorySocket, MemorySocket]:
    lock = threading.Lock()
    left, right = MemorySocket(lock), MemorySocket(lock)
    left.peer, right.peer = right, left
    return left, right
