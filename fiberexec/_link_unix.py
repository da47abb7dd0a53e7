"""The local link: a Unix stream socket between the executor and a worker on its host.

Workers in the executor's network namespace (local processes, host-network containers, jobs
on this machine) reach it through an abstract Unix socket: no file to clean up, invisible
from other network namespaces, so a worker elsewhere fails to connect at once and falls back
to the network link. Each frame travels as ``length:u32 | frame``.

    executor (shard thread)                          worker
    UnixListener --accept, SO_PEERCRED--> UnixPeer <==== UnixLink (main thread waits in poll)
       sends never block: what the socket       sends block, with a timeout
       does not take waits in a write queue
       flushed when the socket is writable

One ``recv`` takes in every frame that has arrived (a worker's prefetched tasks, a batch of
results), so a frame usually costs one system call on each side.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

from fiberexec._errors import LinkClosed, ProtocolError
from fiberexec._framing import FrameBuffer

HEADER = struct.Struct("!I")  # a frame's length, before it
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_QUEUED = 4096  # frames waiting to be written: credit keeps far fewer, so more means hung
_peer_ids = itertools.count(1)


def _new_id() -> int:
    """Pipe ids of local peers are negative, so they never equal a network pipe's id."""
    return -next(_peer_ids)


def framed(frame: bytes) -> list[bytes]:
    return [HEADER.pack(len(frame)), frame]


# ---------------------------------------------------------------------------- executor side


class UnixPipe:
    """One accepted peer, on the executor's side: non-blocking, with a write queue.

    ``close()`` (the shard hanging up on a peer) goes through ``on_close``, so the endpoint
    that watches the socket forgets it first.
    """

    def __init__(self, sock: socket.socket, max_frame: int,
                 on_close: Callable[[UnixPipe], None]) -> None:
        self.id = _new_id()
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = FrameBuffer(max_frame, HEADER)
        self.queue: deque[memoryview] = deque()
        self.closed = False
        self.drained = False  # the last read emptied the socket
        self._on_close = on_close
        self.peer_pid = _peer_pid(sock)  # in this process's pid namespace (the kernel's)

    def read(self) -> list[bytes] | None:
        """The frames that arrived; None once the peer has hung up."""
        try:
            frames = self.reader.read(self.sock)
        except BlockingIOError:
            return []
        except OSError:
            return None
        self.drained = self.reader.drained
        return frames

    def send_nowait(self, frame: bytes) -> bool:
        """Send or queue ``frame``; True when some of it waits for the socket to drain."""
        if self.queue:
            if len(self.queue) >= MAX_QUEUED:
                raise ProtocolError("peer is not reading: its send queue is full")
            self.queue.extend(memoryview(part) for part in framed(frame))
            return True
        parts = framed(frame)
        try:
            sent = self.sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise ProtocolError(f"peer hung up: {exc}") from None
        total = 4 + len(frame)
        if sent == total:
            return False
        self._queue_rest(parts, sent)
        return True

    def _queue_rest(self, parts: list[bytes], sent: int) -> None:
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            self.queue.append(memoryview(part)[sent:])
            sent = 0

    def flush(self) -> bool:
        """Write what the socket takes; True while something still waits."""
        queue = self.queue
        while queue:
            try:
                sent = self.sock.send(queue[0])
            except BlockingIOError:
                return True
            except OSError:
                queue.clear()
                return False
            if sent < len(queue[0]):
                queue[0] = queue[0][sent:]
                return True
            queue.popleft()
        return False

    def close(self) -> None:
        self._on_close(self)

    def shut(self) -> None:
        """Close the socket (the endpoint's part of `close`)."""
        if not self.closed:
            self.closed = True
            self.queue.clear()
            self.sock.close()


class UnixListener:
    """An abstract Unix socket one worker connects to; peers of another user are refused."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.bind("\0" + name)
            self.sock.listen(8)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.fd = self.sock.fileno()
        self.refused = 0

    def accept(self) -> socket.socket | None:
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return None
        if not _trusted(sock):
            self.refused += 1
            sock.close()
            return None
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        self.sock.close()


def _peer_pid(sock: socket.socket) -> int:
    """The peer process's pid as the kernel names it here (0 if it cannot say)."""
    try:
        pid, _uid, _gid = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    except OSError:
        return 0
    return int(pid)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) process ``pid`` has used, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")


def _trusted(sock: socket.socket) -> bool:
    """The peer runs as our user or as root (the kernel says so: SO_PEERCRED)."""
    try:
        _pid, uid, _gid = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    except OSError:
        return False
    return uid in (os.getuid(), 0)


# ---------------------------------------------------------------------------- worker side


class UnixLink:
    """The worker's end: blocking reads with a timeout, blocking sends with a timeout."""

    kind = "unix"

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.reader = FrameBuffer(max_frame, HEADER)
        self.ready: deque[bytes] = deque()
        self._send_timeout = -1.0
        self.closed = False
        # A wait for a frame is a poll for input, not a blocking recv: the kernel signals
        # room to write (the executor read what this end sent) on the wait queue a blocked
        # recv sleeps on, which would wake it for nothing once a round trip; poll's wait
        # wakes for input only.
        self._input = select.poll()
        self._input.register(sock.fileno(), select.POLLIN)

    @classmethod
    def connect(cls, name: str, max_frame: int) -> UnixLink | None:
        """Connect to the executor's abstract socket; None where it cannot be reached."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect("\0" + name)
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.EACCES, errno.EPERM):
                return None
            raise
        return cls(sock, max_frame)

    def recv(self, timeout: float) -> bytes | None:
        """The next frame, or None after ``timeout`` seconds.

        Raises:
            LinkClosed: the executor hung up.
        """
        if self.ready:
            return self.ready.popleft()
        left, deadline = timeout, time.monotonic() + timeout
        while not self.ready:  # a long frame takes several reads
            if left <= 0:
                return None
            if not self._input.poll(math.ceil(left * 1000)):
                return None
            try:  # (a context manager here would be built on every round trip)
                self._read(socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
        return self.ready.popleft()

    def try_recv(self) -> bytes | None:
        if not self.ready:
            try:
                self._read(socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
        return self.ready.popleft() if self.ready else None

    def buffered(self) -> bytes | None:
        """A frame already read from the socket (no system call), or None."""
        return self.ready.popleft() if self.ready else None

    def fileno(self) -> int:
        return self.sock.fileno()

    def _read(self, flags: int) -> None:
        try:
            frames = self.reader.read(self.sock, flags)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise LinkClosed(f"the connection to the executor failed: {exc}") from None
        if frames is None:
            raise LinkClosed("the connection to the executor closed")
        self.ready.extend(frames)

    def _set_send_timeout(self, seconds: float) -> None:
        """A kernel timeout on blocking sends: one system call per send, no poll first."""
        if seconds != self._send_timeout:
            self._send_timeout = seconds
            sec = max(seconds, 0.001)
            value = struct.pack("ll", int(sec), int((sec % 1) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)

    def send(self, frame: bytes, timeout: float) -> None:
        """Send ``frame`` whole, waiting at most ``timeout`` seconds for room."""
        self._set_send_timeout(timeout)
        head, _ = parts = framed(frame)
        try:
            sent = self.sock.sendmsg(parts)
            if sent < len(head) + len(frame):  # the rest as it is, not a joined copy
                if sent < len(head):
                    self.sock.sendall(head[sent:])
                    sent = len(head)
                with memoryview(frame)[sent - len(head):] as rest:
                    self.sock.sendall(rest)
        except OSError as exc:
            raise LinkClosed(f"sending to the executor failed: {exc}") from None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
