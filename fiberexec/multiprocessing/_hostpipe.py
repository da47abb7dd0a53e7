"""Pipes whose ends stay on one host: the standard library's socket pipe, ends handed over
as descriptors.

When every process this one starts runs on its host and network namespace (the backend's
workers dial a loopback address: the local backend, containers on the host's network),
`Pipe` is what the standard library's is: a socket pair (a pair of OS pipes without
``duplex``), read and written by the calling thread itself, with end-of-file when the last
copy of the other end is closed, by `close` or by its process's end. Nothing sits between
the two processes, so a message costs what it costs the standard library.

An end pickled for another process (a `Process`'s arguments, a queue, another pipe) is
registered here under a random key: the process that unpickles it connects to this
process's listener (its abstract Unix socket, see `_links`), names the key and receives a
duplicate of the descriptor (``SCM_RIGHTS``), once, as `multiprocessing.resource_sharer`
hands a descriptor over. The key is the capability: it travels only inside fiberexec's
authenticated channels. A key pickled into a `Process` that ends without taking it is
withdrawn then (`withdraw`), so its pipe's other end sees end-of-file as it would had the
child taken and closed it.

Across hosts (a backend whose workers dial a network address) pipes go through the broker
instead (`_connection`), and an end made here cannot reach such a process: unpickling it
there raises an error that says so.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import secrets
import socket
import threading
from multiprocessing import connection as _mpc
from multiprocessing import context
from multiprocessing import queues as _mpq
from multiprocessing.reduction import ForkingPickler
from typing import Any

from fiberexec import _inherit
from fiberexec._serialize import NEEDS_STDLIB, dumps_as_stdlib, loads_as_stdlib
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._connection import Connection
from fiberexec.multiprocessing._links import HAND_OVER, share_descriptors

KEY_BYTES = 16


class HostConnection(_mpc.Connection, Connection):  # type: ignore[misc]
    """A `Connection` over a socket (or OS pipe) of this host: the standard library's own,
    pickling with fiberexec's pickler and handed to other processes as a descriptor."""

    def __init__(self, handle: int, readable: bool = True, writable: bool = True) -> None:
        super().__init__(handle, readable, writable)
        self._lasting: list[bytes] = []  # keys for every worker of a pool: withdrawn at close

    def _close(self, _close: Any = os.close) -> None:  # `close`, and the collector's
        keys, self._lasting = self._lasting, []
        withdraw(keys)
        super()._close(_close)  # type: ignore[misc]

    def send(self, obj: Any) -> None:
        self._check_closed()  # type: ignore[attr-defined]
        self._check_writable()  # type: ignore[attr-defined]
        self._send_bytes(dumps_as_stdlib(obj, what="object sent through the pipe"))  # type: ignore[attr-defined]

    def recv(self) -> Any:
        self._check_closed()  # type: ignore[attr-defined]
        self._check_readable()  # type: ignore[attr-defined]
        buf = self._recv_bytes()  # type: ignore[attr-defined]
        return loads_as_stdlib(buf.getbuffer())

    def __repr__(self) -> str:
        return f"<Connection fd={getattr(self, '_handle', None)}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # a plain pickle (fiberexec's quick first attempt, which it may discard): register
        # nothing, and name the stdlib's module so that fiberexec's pickler takes over
        return (_not_here, (NEEDS_STDLIB.decode(),))


def _not_here(_marker: str) -> None:
    raise OSError("this pipe end was pickled without fiberexec's pickler; pass it where "
                  "fiberexec sends objects (a Process's arguments, a queue, a pipe, a task)")


def _reduce(conn: HostConnection) -> tuple[Any, ...]:
    """How fiberexec's pickler (and the stdlib's `ForkingPickler`) sends an end."""
    conn._check_closed()  # type: ignore[attr-defined]
    sharer = _sharer()
    # pickled once for every worker a pool starts (an initializer's arguments): each
    # takes it, for as long as the end is open here, as a spawned pool worker would
    lasting = getattr(context.get_spawning_popen(), "DupFd", None) is _inherit.HostFd
    key = sharer.register(conn.fileno(), lasting=lasting)
    captured = getattr(_capture, "keys", None)
    if lasting:
        conn._lasting.append(key)
    elif captured is not None:
        captured.append(key)
    return (_rebuild, (sharer.address, key, conn.readable, conn.writable))


ForkingPickler.register(HostConnection, _reduce)


def _rebuild(address: bytes, key: bytes, readable: bool, writable: bool) -> HostConnection:
    return HostConnection(fetch(address, key), readable, writable)


def pipe(duplex: bool) -> tuple[HostConnection, HostConnection]:
    """A pipe of this host, as `multiprocessing.Pipe` makes it."""
    if duplex:
        left, right = socket.socketpair()
        return HostConnection(left.detach()), HostConnection(right.detach())
    r, w = os.pipe()
    return HostConnection(r, writable=False), HostConnection(w, readable=False)


class HostSimpleQueue(_mpq.SimpleQueue):  # type: ignore[type-arg]
    """`SimpleQueue` where every process runs on this host: the standard library's own (one
    pipe, written and read under locks), over this module's `pipe` (its ends handed over as
    this module's are) and this layer's `Lock` (a kernel semaphore here), pickling items with
    fiberexec's pickler as its other queues do. So the standard library's `Pool` and
    `ProcessPoolExecutor`, which build their queues from the context they are given, pass
    their tasks and results as they do on their own.

    As the layer's other `SimpleQueue`, it may also be pickled outside a `Process`'s
    arguments, and ``get`` also takes ``block`` and ``timeout`` (raising `queue.Empty`).
    """

    def __init__(self, *, ctx: Any) -> None:  # the stdlib's, with this module's pipe
        self._reader, self._writer = pipe(duplex=False)
        self._rlock = ctx.Lock()
        self._poll = self._reader.poll
        self._wlock = ctx.Lock()

    def __getstate__(self) -> Any:  # the stdlib's, without assert_spawning
        return (self._reader, self._writer, self._rlock, self._wlock)

    def put(self, obj: Any) -> None:
        data = dumps_as_stdlib(obj, what="object put on the queue")  # before the lock
        with self._wlock:
            self._writer.send_bytes(data)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and timeout is None:
            with self._rlock:
                data = self._reader.recv_bytes()
            return loads_as_stdlib(data)
        deadline = _timing.Deadline(timeout or 0.0)
        if not self._rlock.acquire(block, deadline.left() if block else None):
            raise queue.Empty
        try:
            if not self._reader.poll(deadline.left() if block else 0):
                raise queue.Empty
            data = self._reader.recv_bytes()
        finally:
            self._rlock.release()
        return loads_as_stdlib(data)


def usable(advertised: str) -> bool:
    """Whether pipes made here stay on this host: the backend's processes dial ``advertised``
    (the broker's address), and a loopback address is reached only from this host's network
    namespace, where this process's abstract socket is reachable too."""
    host = advertised.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- handing descriptors over

_capture = threading.local()  # .keys: the ends this thread pickles into a Process payload


def capture_keys() -> list[bytes]:
    """Start recording the keys of ends this thread pickles (see `Process.start`)."""
    keys: list[bytes] = []
    _capture.keys = keys
    return keys


def stop_capture() -> None:
    _capture.keys = None


def withdraw(keys: list[bytes]) -> None:
    """Close what was registered under ``keys`` and not taken (its process has ended)."""
    sharer = _current
    if sharer is not None and sharer.pid == os.getpid():
        for key in keys:
            sharer.withdraw(key)


class _Sharer:
    """What this process hands over, and how (to those that connect to its listener, each
    in a thread of its own: one that connects and says nothing, stopped or killed, holds
    only that thread, for `Timing.fetch`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._fds: dict[bytes, tuple[int, bool]] = {}  # key -> (descriptor, lasting)
        self._lock = threading.Lock()
        self.address = share_descriptors(self._answer).encode()

    def register(self, fd: int, lasting: bool = False) -> bytes:
        """A key for a duplicate of ``fd``: taken once, or (``lasting``) by every process
        that asks until it is withdrawn."""
        key = secrets.token_bytes(KEY_BYTES)
        dup = os.dup(fd)
        with self._lock:
            self._fds[key] = (dup, lasting)
        return key

    def withdraw(self, key: bytes) -> None:
        with self._lock:
            entry = self._fds.pop(key, None)
        if entry is not None:
            os.close(entry[0])

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            self._hand_over(conn)

    def _hand_over(self, conn: socket.socket) -> None:
        conn.settimeout(_timing.TIMING.fetch)
        key = b""
        with contextlib.suppress(OSError):
            while len(key) < KEY_BYTES:
                more = conn.recv(KEY_BYTES - len(key))
                if not more:
                    return
                key += more
        with self._lock:
            fd, lasting = self._fds.get(key, (-1, False))
            if fd < 0:
                with contextlib.suppress(OSError):
                    conn.sendall(b"N")
                return
            if not lasting:
                del self._fds[key]
            with contextlib.suppress(OSError):  # sent under the lock: not closed meanwhile
                socket.send_fds(conn, [b"Y"], [fd])
        if not lasting:
            os.close(fd)


_current: _Sharer | None = None
_current_lock = threading.Lock()


def _sharer() -> _Sharer:
    global _current
    with _current_lock:
        if _current is None or _current.pid != os.getpid():  # none yet, or we were forked
            _current = _Sharer()
        return _current


def fetch(address: bytes, key: bytes) -> int:
    """The descriptor registered under ``key`` at ``address``, duplicated into this process.

    Raises:
        OSError: the sharing process cannot be reached from here (another host or network
            namespace), has ended, or handed this end over already.
    """
    pid = address.split(b"-")[2].decode(errors="replace")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_timing.TIMING.fetch)
        try:
            sock.connect(address)
        except OSError as exc:
            raise OSError(
                f"cannot receive a pipe end from process {pid}: {exc.strerror or exc}. A pipe "
                "made where processes run on this host reaches processes on this host only "
                "(and only while the process that sent it runs); to use pipes across hosts, "
                "choose the backend (set_default_backend, FIBEREXEC_BACKEND) before creating "
                "the Pipe") from exc
        try:
            sock.sendall(HAND_OVER + key)
            answer, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
        except TimeoutError:
            raise OSError(f"cannot receive a pipe end from process {pid}: it did not hand it "
                          f"over within {_timing.TIMING.fetch:.0f}s (it is stopped or "
                          "overloaded)") from None
    if answer != b"Y" or not fds:
        for fd in fds:
            os.close(fd)
        raise OSError("cannot receive a pipe end: it was handed to another process already "
                      "(each pickled copy of an end can be unpickled once, as in the "
                      "standard library)")
    return fds[0]
