"""The local link: a Unix stream socket between the executor and a worker on its host.

Workers in the executor's network namespace (local processes, host-network containers, jobs
on this machine) reach it through an abstract Unix socket: no file to clean up, invisible
from other network namespaces, so a worker elsewhere fails to connect at once and falls back
to the network link. Each frame travels as ``length:u32 | frame``.

    executor (shard thread)                          worker
    UnixListener --accept, SO_PEERCRED--> UnixPeer <==== UnixLink (main thread blocks in recv)
       sends never block: what the socket       sends block, with a timeout
       does not take waits in a write queue
       flushed when the socket is writable

One ``recv`` takes in every frame that has arrived (a worker's prefetched tasks, a batch of
results), so a frame usually costs one system call on each side.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Callable

from fiberexec._errors import LinkClosed, ProtocolError

_LEN = struct.Struct("!I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
CHUNK = 64 << 10  # bytes one recv asks for, at least
KEPT = 512 << 10  # a read buffer grown past this (by a long frame) is let go once emptied
MAX_QUEUED = 4096  # frames waiting to be written: credit keeps far fewer, so more means hung
_peer_ids = itertools.count(1)


def _new_id() -> int:
    """Pipe ids of local peers are negative, so they never equal a network pipe's id."""
    return -next(_peer_ids)


class FrameBuffer:
    """Bytes read from a stream, cut into frames of ``length | frame``.

    Reads land in one reused buffer (``recv_into``): no object is made per read, and a frame
    is copied once, out of the buffer, when it is whole. A frame longer than the buffer
    grows it to the frame's size for as long as it takes to arrive; a buffer grown past
    `KEPT` is let go once emptied, so a peer that sent one large result keeps no more.
    """

    def __init__(self, max_frame: int, header: struct.Struct = _LEN) -> None:
        self.max_frame = max_frame
        self._head = header
        self._buf = bytearray(CHUNK)
        self._start = 0  # the first byte not yet cut into a frame
        self._end = 0  # the end of what has been read

    def read_from(self, sock: socket.socket, flags: int = 0) -> tuple[int, int]:
        """One ``recv`` into the buffer: (bytes read, bytes asked); 0 read means EOF."""
        want = self.want()
        if len(self._buf) - self._end < want:
            self._make_room(want)
        with memoryview(self._buf)[self._end:] as tail:
            n = sock.recv_into(tail, want, flags)
        self._end += n
        return n, want

    def frames(self) -> list[bytes]:
        """Every whole frame buffered, in order."""
        out: list[bytes] = []
        buf, pos, end = self._buf, self._start, self._end
        head, unpack = self._head.size, self._head.unpack_from
        with memoryview(buf) as view:
            while end - pos >= head:
                (size,) = unpack(buf, pos)
                if size > self.max_frame:
                    raise ProtocolError(
                        f"{size}-byte frame exceeds max_message_size={self.max_frame}")
                if end - pos - head < size:
                    break
                pos += head
                out.append(bytes(view[pos : pos + size]))
                pos += size
        if pos == end:
            pos = end = 0
            if len(buf) > KEPT:
                self._buf = bytearray(CHUNK)
        self._start, self._end = pos, end
        return out

    def want(self) -> int:
        """How many bytes the next read should ask for: at least the rest of a long frame."""
        have, head = self._end - self._start, self._head.size
        if have >= head:
            size: int = self._head.unpack_from(self._buf, self._start)[0]
            return max(CHUNK, head + size - have)
        return CHUNK

    def _make_room(self, want: int) -> None:
        """A buffer with ``want`` bytes free after what is held (moved to its start)."""
        have = self._end - self._start
        grown = bytearray(max(CHUNK, have + want))
        with memoryview(self._buf) as view:
            grown[:have] = view[self._start : self._end]
        self._buf, self._start, self._end = grown, 0, have


def framed(frame: bytes) -> list[bytes]:
    return [_LEN.pack(len(frame)), frame]


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
        self.reader = FrameBuffer(max_frame)
        self.queue: deque[memoryview] = deque()
        self.closed = False
        self.drained = False  # the last read emptied the socket
        self._on_close = on_close

    def read(self) -> list[bytes] | None:
        """The frames that arrived; None once the peer has hung up."""
        try:
            n, want = self.reader.read_from(self.sock)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not n:
            return None
        self.drained = n < want
        return self.reader.frames()

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
        self.reader = FrameBuffer(max_frame)
        self.ready: deque[bytes] = deque()
        self._timeouts = {socket.SO_RCVTIMEO: -1.0, socket.SO_SNDTIMEO: -1.0}
        self.closed = False

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
            self._set_timeout(socket.SO_RCVTIMEO, left)
            try:
                self._read(0)
            except (BlockingIOError, TimeoutError):
                return None
            left = deadline - time.monotonic()
        return self.ready.popleft()

    def try_recv(self) -> bytes | None:
        if not self.ready:
            try:
                self._read(socket.MSG_DONTWAIT)
            except (BlockingIOError, TimeoutError):
                return None
        return self.ready.popleft() if self.ready else None

    def buffered(self) -> bytes | None:
        """A frame already read from the socket (no system call), or None."""
        return self.ready.popleft() if self.ready else None

    def fileno(self) -> int:
        return self.sock.fileno()

    def _read(self, flags: int) -> None:
        try:
            n, _ = self.reader.read_from(self.sock, flags)
        except (BlockingIOError, TimeoutError):
            raise
        except OSError as exc:
            raise LinkClosed(f"the connection to the executor failed: {exc}") from None
        if not n:
            raise LinkClosed("the connection to the executor closed")
        self.ready.extend(self.reader.frames())

    def _set_timeout(self, option: int, seconds: float) -> None:
        """A kernel timeout on a blocking socket: one system call per recv, no poll first."""
        if seconds != self._timeouts[option]:
            self._timeouts[option] = seconds
            sec = max(seconds, 0.001)
            value = struct.pack("ll", int(sec), int((sec % 1) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, option, value)

    def send(self, frame: bytes, timeout: float) -> None:
        """Send ``frame`` whole, waiting at most ``timeout`` seconds for room."""
        self._set_timeout(socket.SO_SNDTIMEO, timeout)
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
