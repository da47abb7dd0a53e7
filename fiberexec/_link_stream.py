"""The stream links: a Unix or TCP stream socket between the executor and one worker.

Workers in the executor's network namespace (local processes, host-network containers, jobs
on this machine) reach it through an abstract Unix socket: no file to clean up, invisible
from other network namespaces, so a worker elsewhere fails to connect at once and falls back
to the network. There, without TLS, it dials a TCP port the executor opened for it alone;
the same code carries both, each frame as ``length:u32 | frame``.

    executor (shard thread)                             worker
    UnixListener --accept, SO_PEERCRED--> StreamPipe <== StreamLink "unix" (main thread polls)
    TcpListener  --accept, TCP_NODELAY--> StreamPipe <== StreamLink "tcp"
       sends never block: what the socket         sends block, with a timeout
       does not take waits in a write queue
       flushed when the socket is writable

One ``recv`` takes in every frame that has arrived (a worker's prefetched tasks, a batch of
results), so a frame usually costs one system call on each side. Who may talk is settled
above the link, by the handshake's proofs of the executor's secret (`fiberexec._auth`); on
the Unix socket the kernel also names the peer's user, and a peer of another user is
refused before it can send anything.
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
from typing import TypeVar

from fiberexec._errors import ConfigurationError, LinkClosed, ProtocolError
from fiberexec._framing import FrameBuffer, framed

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_QUEUED = 4096  # frames waiting to be written: credit keeps far fewer, so more means hung
BACKLOG = 8  # connections a listener holds unaccepted: one worker dials it, once or twice
# A worker whose TCP dial is refused dials again, each wait twice the one before, up to the
# second (nng's reconnection, which the network link had: a worker whose executor is gone
# keeps trying until its connect timeout, as it did then, and a backend can find it stray)
REDIAL_WAIT = (0.01, 0.5)
_peer_ids = itertools.count(1)
T = TypeVar("T")


def _new_id() -> int:
    """Pipe ids of local peers are negative, so they never equal a network pipe's id."""
    return -next(_peer_ids)


def tcp_host_port(address: str) -> tuple[str, int]:
    """``tcp://host:port`` (an IPv6 host in brackets) as ``(host, port)``.

    Raises:
        LinkClosed: ``address`` is not such an address.
    """
    rest = address.removeprefix("tcp://")
    host, _, port = rest.rpartition(":")
    if rest == address or not host or not port.isdigit():
        raise LinkClosed(f"cannot dial {address!r}: the executor's address must be "
                         "tcp://host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


# ---------------------------------------------------------------------------- executor side


class StreamPipe:
    """One accepted peer, on the executor's side: non-blocking, with a write queue.

    ``kind`` is its socket's: "unix" or "tcp". ``close()`` (the shard hanging up on a peer)
    goes through ``on_close``, so the endpoint that watches the socket forgets it first.
    """

    def __init__(self, sock: socket.socket, max_frame: int,
                 on_close: Callable[[StreamPipe], None]) -> None:
        self.id = _new_id()
        self.sock = sock
        self.fd = sock.fileno()
        self.kind = "unix" if sock.family == socket.AF_UNIX else "tcp"
        self.reader = FrameBuffer(max_frame)
        self.queue: deque[memoryview] = deque()
        self.closed = False
        self.drained = False  # the last read emptied the socket
        self._on_close = on_close
        # in this process's pid namespace (the kernel's); none across a network
        self.peer_pid = _peer_pid(sock) if self.kind == "unix" else 0

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


class TcpListener:
    """A TCP port one worker elsewhere dials (the network link without TLS): on ``host``,
    any free port, or the first free one of the inclusive range ``ports`` from ``first`` on.

    Raises:
        ConfigurationError: every port of ``ports`` is taken.
    """

    def __init__(self, host: str, *, ports: tuple[int, int] | None = None,
                 first: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = in_range(ports, first, lambda port: _bound(family, host, port))
        self.fd = self.sock.fileno()
        self.port = int(self.sock.getsockname()[1])
        self.address = f"tcp://{f'[{host}]' if ':' in host else host}:{self.port}"

    def fileno(self) -> int:
        return self.fd

    def accept(self) -> socket.socket | None:
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a frame goes at once
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        self.sock.close()


def _bound(family: socket.AddressFamily, host: str, port: int) -> socket.socket | None:
    """A non-blocking socket listening on ``host:port``; None if the port is taken."""
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(BACKLOG)  # (refused here when another socket listens there too)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            sock.close()
            return None
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def in_range(ports: tuple[int, int] | None, first: int, attempt: Callable[[int], T | None]) -> T:
    """``attempt(port)`` on port 0 (any free one), or on each port of the inclusive range
    ``ports`` from ``first`` on (wrapping around) until one is not None (not taken).

    Raises:
        ConfigurationError: every port of ``ports`` is taken.
    """
    if ports is None:
        found = attempt(0)
        if found is None:
            raise ConfigurationError("no free port to listen on")
        return found
    low, high = ports
    span = high - low + 1
    for i in range(span):
        found = attempt(low + (max(first, low) - low + i) % span)
        if found is not None:
            return found
    raise ConfigurationError(
        f"every port of ports={low}-{high} is in use; widen the range (one port per worker)"
    )


def _connected(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port``, dialed again while refused (as data: tenacity's
    backoff, imported only then) until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout

    def attempt() -> socket.socket:
        return socket.create_connection((host, port), max(deadline - time.monotonic(), 0.001))

    try:
        return attempt()
    except ConnectionRefusedError:
        if timeout <= 0:
            raise
    import tenacity

    first, most = REDIAL_WAIT
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(ConnectionRefusedError),
        wait=tenacity.wait_exponential(multiplier=first, max=most),
        stop=tenacity.stop_after_delay(timeout),
        reraise=True,
    )(attempt)


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


def connect_abstract(name: str, timeout: float | None = None) -> socket.socket | None:
    """A blocking connection to the abstract Unix socket ``name`` (its leading NUL
    included), or None where this host and network namespace have none by that name (or
    refuse it). What an executor's worker and the multiprocessing layer dial first."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(name)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.EACCES, errno.EPERM,
                         errno.EAGAIN) or isinstance(exc, TimeoutError):
            return None
        raise
    return sock


class StreamLink:
    """The worker's end: blocking reads with a timeout, blocking sends with a timeout."""

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.kind = "unix" if sock.family == socket.AF_UNIX else "tcp"
        self.reader = FrameBuffer(max_frame)
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
    def connect(cls, name: str, max_frame: int) -> StreamLink | None:
        """Connect to the executor's abstract socket; None where it cannot be reached."""
        sock = connect_abstract("\0" + name)
        return None if sock is None else cls(sock, max_frame)

    @classmethod
    def dial(cls, address: str, max_frame: int, timeout: float) -> StreamLink:
        """Connect to the executor's TCP port at ``address`` (``tcp://host:port``), dialing
        again while it refuses, for up to ``timeout`` seconds.

        Raises:
            LinkClosed: no connection within ``timeout``, or the address is not one.
        """
        host, port = tcp_host_port(address)
        try:
            sock = _connected(host, port, timeout)
        except ConnectionRefusedError as exc:
            raise LinkClosed(f"the executor at {address} refused the connection for "
                             f"{timeout:g} s: it has shut down or exited") from exc
        except OSError as exc:
            raise LinkClosed(f"cannot connect to the executor at {address}: {exc}") from exc
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a frame goes at once
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
