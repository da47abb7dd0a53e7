"""Authenticated request/reply over sockets: the transport of processes, locks, managers.

    client (a connection per thread)              server (a thread per connection)
      | -- dial + handshake (`_links`) ------> |   nothing is read before the handshake
      | <-- b"K" local name ------------------ |   the server's abstract Unix socket
      | -- b"R" len head body ---------------> |   head: pickled (call, caller)
      | <-- b"O" len head body / b"E" error -- |

A frame is a 4-byte length and its bytes (`_links.Wire`). Each client thread has its own
connection and each connection its own server thread, so one blocking request (a ``get``
waiting for an item) never holds up the others, and a call waits in a plain socket read:
Ctrl-C interrupts it, as it interrupts the standard library's manager calls. Servers that
live in this process are called directly.

The server listens on TCP, and on Linux also on an abstract Unix socket whose name it
gives in ``b"K"``: a client of the same host and network namespace uses that one, so
calls skip the TCP stack (as the standard library's managers use a Unix socket).

A server that dies normally closes its connections: the client's first connection, which
it keeps open and reads in a thread (`RpcClient.lost`), sees that at once, even while no
call waits, and every waiting call raises `ConnectionError`. The calls are typed
(`_calls`). One that dies silently (its
host or container vanished, or it stopped) is found by the client: while calls are
waiting, it asks the server every ``Timing.heartbeat`` seconds whether it is alive (a
`_calls.Ping`, answered by the transport itself); no answer within ``Timing.ping`` and
the client is declared lost, which wakes every waiting call with a `ConnectionError` that
names the server.

A client's first connection says it is its process's monitor (`_calls.Monitor`, before any
call) and stays open while the client lives, which is as long as its process: the server
knows every process that calls it, and learns when one is gone (`Callers`), so what a
killed process held there is released (`_sync_server.ObjectTable.drop_holder`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, Protocol

from fiberexec._errors import ProtocolError
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._calls import Call, Monitor, Ping
from fiberexec.multiprocessing._cond import Condition
from fiberexec.multiprocessing._errors import AuthenticationError
from fiberexec.multiprocessing._links import (
    RPC,
    Wire,
    dial,
    drop,
    shared,
    tcp_text,
)

log = logging.getLogger("fiberexec.multiprocessing")
_LEN = struct.Struct("!I")
Caller = tuple[str, int]  # (client token, thread id): who holds a remote lock
Handler = Callable[[Call, bytes, Caller], tuple[Any, bytes]]

_local_servers: dict[str, RpcServer] = {}
serving = threading.local()  # .sock: the connection this server thread answers (`_serve`)
_clients: dict[str, RpcClient] = {}
# re-entrant: a garbage collection inside it (say while a client is made) may run a dropped
# manager's or proxy's finalizer in this very thread, and that calls a server too
_clients_lock = threading.RLock()
_TOKEN = secrets.token_hex(8)  # who this process is to the servers it calls


def process_token() -> str:
    """This process's token (a forked child gets its own: see `_forked`)."""
    return _TOKEN


def _forked() -> None:
    """In a child forked from a process that imported this module (the local backend's
    launcher): a token of its own, or servers would take it for its siblings."""
    global _TOKEN
    _TOKEN = secrets.token_hex(8)


os.register_at_fork(after_in_child=_forked)


_NO_HEAD = pickle.dumps(None, protocol=5)  # most answers' head: pickled once


def _frame(tag: bytes, head: Any, body: bytes | memoryview) -> list[bytes | memoryview]:
    data = _NO_HEAD if head is None else pickle.dumps(head, protocol=5)
    return [tag, _LEN.pack(len(data)), data, body]


def _split(frame: bytes) -> tuple[Any, memoryview]:
    view = memoryview(frame)
    (size,) = _LEN.unpack_from(view, 1)
    head = pickle.loads(view[1 + _LEN.size : 1 + _LEN.size + size])
    return head, view[1 + _LEN.size + size :]


def caller_gone() -> bool:
    """Whether the client this server thread answers has hung up (its process ended while
    its call waited here); False on any other thread (a call in the server's own process)."""
    sock: socket.socket | None = getattr(serving, "sock", None)
    if sock is None:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # nothing to read: it waits for the answer
    except OSError:
        return True  # reset


def caller_waits(wait: Callable[[float | None], bool], timeout: float | None) -> bool:
    """``wait(timeout)`` on behalf of the client this server thread answers, in pieces of
    `Timing.gone_check` seconds, ending early (False) once that client has hung up: a wait the
    kernel does (a semaphore's) cannot also watch the connection, and one left running for
    a killed process would keep what it waits on (a lock, and its semaphore's file) for the
    rest of the request. On any other thread, ``wait(timeout)`` as it is."""
    if getattr(serving, "sock", None) is None:
        return wait(timeout)
    return _timing.in_pieces(wait, timeout, _timing.TIMING.gone_check, stop=caller_gone)


def _tcp_address(address: str) -> tuple[str, int]:
    if not address.startswith("tcp://"):
        raise ValueError(f"not a server address: {address!r} (expected tcp://host:port)")
    host, _, port = address[len("tcp://"):].rpartition(":")
    return host.strip("[]"), int(port)


def _pickle_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc, protocol=5)
    except Exception:
        from fiberexec.multiprocessing._remote_error import RemoteError

        return pickle.dumps(RemoteError(f"{type(exc).__name__}: {exc}"), protocol=5)


class Holders(Protocol):
    """What a server keeps for the processes that call it, by token, released for one that
    is gone (`_sync_server.ObjectTable`)."""

    def drop_holder(self, token: str) -> None:
        """Release all ``token`` holds; calls of it that still come change nothing."""

    def forget_holder(self, token: str) -> None:
        """No call of ``token`` can come any more (its last connection closed)."""


@dataclass
class _Conn:
    """What a server knows of one connection."""

    token: str | None = None  # of the process calling on it (said with its first call)
    monitor: bool = False  # it is that process's monitor (`_calls.Monitor`)


@dataclass
class _Calling:
    """A process calling a server: its open connections, and whether it is gone."""

    conns: int = 0
    monitors: int = 0
    gone: bool = False  # its last monitor closed: what it held is (being) released
    dropped: bool = False  # and that is done


class Callers:
    """The processes that call a server, by token, and which of them are gone.

    A client's monitor connection is open before its first call and closes only with the
    client, which lives as long as its process (`client_for` replaces a lost one only once
    its successor's monitor is open): so a process is gone once its last monitor closed,
    and what it held is released then (``holders.drop_holder``), without waiting for its
    other connections, on which a call may still run (a wait on a lock or a barrier, for a
    slice or longer). A call of it answered after that changes nothing (the table ignores
    a holder dropped); once its last connection closed, no call of it can come, and the
    table forgets it (``forget_holder``). A process that never sent a monitor (a forked
    child, calling through the client it inherited) is never taken as gone, nor is this
    process (a client of its own server, which it calls directly otherwise)."""

    def __init__(self, holders: Holders | None) -> None:
        self.holders = holders
        self._cond = threading.Condition()
        self._calling: dict[str, _Calling] = {}

    def came(self, conn: _Conn, token: str, monitor: bool) -> None:
        """``conn``'s first call: it is a connection of ``token``'s process."""
        conn.token, conn.monitor = token, monitor
        with self._cond:
            calling = self._calling.setdefault(token, _Calling())
            calling.conns += 1
            calling.monitors += monitor

    def left(self, conn: _Conn, closing: bool) -> None:
        """``conn`` closed: release what its process held if it is gone (not while
        ``closing``: the server closes every connection, the processes live on)."""
        token, holders = conn.token, self.holders
        if token is None:
            return
        with self._cond:
            calling = self._calling[token]
            calling.conns -= 1
            calling.monitors -= conn.monitor
            drop = (holders is not None and conn.monitor and not calling.monitors
                    and not calling.gone and not closing and token != _TOKEN)
            calling.gone = calling.gone or drop
            over = self._settle(token, calling)
            self._cond.notify_all()
        if holders is None:
            return
        if drop:
            self._drop(holders, token, calling)
        elif over:
            holders.forget_holder(token)

    def _drop(self, holders: Holders, token: str, calling: _Calling) -> None:
        """Release what ``token`` held; forget it if its last connection closed meanwhile."""
        try:
            holders.drop_holder(token)
        except Exception:  # a server thread's end: nothing to re-raise it to
            log.exception("releasing what a process that is gone held failed")
        with self._cond:
            calling.dropped = True
            over = self._settle(token, calling)
            self._cond.notify_all()
        if over:
            holders.forget_holder(token)

    def _settle(self, token: str, calling: _Calling) -> bool:
        """(Under the lock) Forget ``token`` once none of its connections is open and, if it
        is gone, what it held is released; whether it was dropped so (its holders are
        forgotten then too)."""
        if calling.conns or (calling.gone and not calling.dropped):
            return False
        del self._calling[token]
        return calling.dropped

    def await_gone(self, token: str, timeout: float) -> bool:
        """Wait up to ``timeout`` until ``token``'s process, known to have ended, is seen
        gone, what it held released, and its calls under way ended (a wait it made here
        ends as its caller is seen gone: `caller_waits`); False if a connection of it is
        still open."""

        def released() -> bool:
            calling = self._calling.get(token)
            return calling is None or not (calling.gone or calling.monitors)

        with self._cond:
            return self._cond.wait_for(released, timeout)


class RpcServer:
    """Serve ``handler(call, body, caller) -> (result, body)`` to authenticated clients;
    what ``holders`` keeps for a process that called is released once it is gone
    (`Callers`)."""

    def __init__(self, secret: bytes, handler: Handler, host: str = "127.0.0.1",
                 holders: Holders | None = None) -> None:
        self.secret = secret
        self.handler = handler
        self.callers = Callers(holders)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self.offer = shared(secret, RPC, self._serve)  # this process's listener
        try:
            self.port = self.offer.listen_tcp(host)
        except BaseException:
            self.offer.withdraw()
            raise
        self.address = f"tcp://{tcp_text(host, self.port)}"
        self.local_name = self.offer.unix
        _local_servers[self.address] = self

    @property
    def rejected(self) -> int:
        """Connections that failed the handshake."""
        return self.offer.listener.rejected

    def advertised(self, host: str) -> str:
        """The address clients elsewhere dial: this server's port on ``host``."""
        return f"tcp://{tcp_text(host, self.port)}"

    def _serve(self, sock: socket.socket) -> None:
        """Answer an authenticated client's calls until it goes (in its own thread)."""
        with self._lock:
            if self._closed:
                drop(sock)
                return
            self._conns.add(sock)
        wire = Wire(sock)
        serving.sock = sock
        conn = _Conn()
        try:
            wire.send_parts([b"K", self.local_name.encode()])
            while True:
                frame = wire.recv_bytes()
                if frame[:1] != b"R":
                    log.warning("a client of %s sent a %r frame; hung up on it", self.address,
                                frame[:1])
                    return
                wire.send_parts(self._dispatch(frame, conn))
        except (OSError, EOFError, ProtocolError):
            pass  # the client went away (or broke the protocol): its connection ends
        finally:
            with self._lock:
                self._conns.discard(sock)
                closing = self._closed
            drop(sock)
            self.callers.left(conn, closing)

    def _dispatch(self, frame: bytes, conn: _Conn) -> list[bytes | memoryview]:
        try:
            (call, caller), body = _split(frame)
            if conn.token is None:
                self.callers.came(conn, caller[0], isinstance(call, Monitor))
            if isinstance(call, Ping | Monitor):
                return _frame(b"O", None, b"")
            result, out = self.handler(call, bytes(body), caller)
            return _frame(b"O", result, out)
        except BaseException as exc:  # the caller re-raises it
            return [b"E", _pickle_error(exc)]

    def call_local(self, call: Call, body: bytes) -> tuple[Any, bytes]:
        return self.handler(call, body, (_TOKEN, threading.get_ident()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        _local_servers.pop(self.address, None)
        self.offer.withdraw()
        for sock in conns:
            drop(sock)


class _Busy:
    """`RpcClient.busy`'s context manager (a class: it is entered on every stream wait)."""

    def __init__(self, client: RpcClient) -> None:
        self.client = client

    def __enter__(self) -> None:
        client = self.client
        with client._count:
            client._busy += 1
            first = client._busy == 1
        if first and (client._watcher is None or client._idle):
            client._enter_busy()  # start the watcher, or wake it: it waits for a wait

    def __exit__(self, *exc_info: object) -> None:
        client = self.client
        with client._count:
            client._busy -= 1




class _Channel:
    """One client thread's connection to a server (closed when the thread's state goes)."""

    __slots__ = ("__weakref__", "sock", "timeout", "wire")

    def __init__(self, wire: Wire) -> None:
        self.wire = wire
        self.sock = wire.sock
        self.timeout: float | None = -1.0  # the socket's timeout: not yet set here

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class RpcClient:
    """Authenticated connections to a server; thread-safe (a connection per thread)."""

    def __init__(self, address: str, secret: bytes, *, timeout: float | None = None) -> None:
        """``timeout``: to connect and prove the secret (None: `Timing.stream`)."""
        self.address = address
        self.lost = threading.Event()
        self._secret = secret
        self._connect_timeout = _timing.TIMING.stream if timeout is None else timeout
        self.listeners: list[Callable[[], None]] = []
        self._local = threading.local()
        self._channels: weakref.WeakSet[_Channel] = weakref.WeakSet()
        self._lock = threading.RLock()  # re-entrant for finalizers, as `_clients_lock`
        self.why = (f"the connection to {address} was lost: the process serving it exited, or "
                    "its host is unreachable")
        self._busy = 0  # calls (and stream reads, see `busy`) waiting on this server
        self._count = threading.Lock()  # guards ``_busy`` (cheaper than ``_watch``)
        self._idle = False  # the watcher waits for ``_busy`` to become positive
        self._watch = Condition()
        self._busy_mark = _Busy(self)
        self._watcher: threading.Thread | None = None
        self._closed = False
        self._local_name = ""  # the server's abstract Unix socket, learned in the handshake
        # a server that takes the connection and says nothing (stopped) is found by the same
        # bound as one that stops answering later
        self._monitor = self._open_monitor(min(self._connect_timeout, _timing.TIMING.ping))
        threading.Thread(target=self._await_end, daemon=True,
                         name="fiberexec-mp-rpc-watch").start()

    def _await_end(self) -> None:
        """Read the first connection, on which the server never writes: this returns when
        the server's end closes."""
        with contextlib.suppress(OSError):
            self._monitor.settimeout(None)
            self._monitor.recv(1)
        if not self._closed:
            self._lose(f"the process serving {self.address} is gone (its connection closed)")

    def _open_monitor(self, timeout: float) -> socket.socket:
        """The first connection: it tells the server it is this process's monitor (the
        answer read before any call is made, so the server knows of this process by then);
        from then on only `_await_end` reads it."""
        wire = self._connect(timeout)
        try:
            wire.send_parts(_frame(b"R", (Monitor(), (_TOKEN, 0)), b""))
            answer = wire.recv_bytes()
        except (OSError, EOFError) as exc:
            drop(wire.sock)
            raise ConnectionError(f"{self.address} broke off a new connection: {exc}") from None
        if answer[:1] != b"O":
            drop(wire.sock)
            raise ProtocolError(f"{self.address} answered {answer[:1]!r} to a monitor")
        return wire.sock

    def _connect(self, timeout: float) -> Wire:
        """An authenticated connection (by the server's Unix socket once known), its
        ``b"K"`` read; the server's local name kept."""
        try:
            sock = dial(self._secret, self._local_name, _tcp_address(self.address),
                        service=RPC, timeout=timeout)
        except AuthenticationError:  # it names the peer
            raise
        except TimeoutError:
            raise ConnectionError(
                f"{self.address} stopped answering (no handshake within {timeout:.0f}s): its "
                "process is stopped or overloaded, or its host is unreachable") from None
        except (OSError, EOFError) as exc:  # refused, reset...: said as the OS said it
            kind = type(exc) if isinstance(exc, ConnectionError) else ConnectionError
            raise kind(f"cannot reach {self.address}: {exc}; is its owner alive?") from None
        wire = Wire(sock)
        try:
            sock.settimeout(timeout)
            ok = wire.recv_bytes()
        except (OSError, EOFError) as exc:
            drop(sock)
            raise ConnectionError(f"{self.address} broke off the handshake: {exc}") from None
        if ok[:1] != b"K":
            drop(sock)
            raise ProtocolError(f"{self.address} answered {ok[:1]!r} to a new connection")
        self._local_name = ok[1:].decode()
        return wire

    def _channel(self, limit: float | None) -> _Channel:
        """This thread's connection, made (within ``limit`` seconds, if given) on first use."""
        channel: _Channel | None = getattr(self._local, "channel", None)
        if channel is not None:
            return channel
        if self.lost.is_set():  # (the stdlib's proxies meet a closed pipe, as here)
            raise BrokenPipeError(self.why)
        timeout = self._connect_timeout if limit is None else min(limit,
                                                                   self._connect_timeout)
        channel = self._local.channel = _Channel(self._connect(timeout))
        with self._lock:
            self._channels.add(channel)
        if self.lost.is_set():  # lost while connecting: `_close_channels` may have missed it
            self._forget(channel)
            raise BrokenPipeError(self.why)
        return channel

    def _forget(self, channel: _Channel) -> None:
        """Drop this thread's connection (its state is unknown after a failed call)."""
        if getattr(self._local, "channel", None) is channel:
            del self._local.channel
        drop(channel.sock)

    def _roundtrip(self, parts: list[bytes | memoryview], timeout: float | None) -> bytes:
        channel = self._channel(timeout)
        try:
            if channel.timeout != timeout:
                channel.sock.settimeout(timeout)
                channel.timeout = timeout
            channel.wire.send_parts(parts)
            return channel.wire.recv_bytes()
        except TimeoutError:
            self._forget(channel)
            raise ConnectionError(
                f"{self.address} did not answer within {timeout}s; is its owner alive?"
            ) from None
        except (OSError, EOFError, ProtocolError):
            self._forget(channel)
            raise BrokenPipeError(self.why) from None
        except BaseException:  # Ctrl-C mid-call: the answer would come to the next call
            self._forget(channel)
            raise

    def busy(self) -> _Busy:
        """Mark a wait on this server (``with client.busy(): ...``): while any lasts, the
        server's liveness is checked."""
        return self._busy_mark

    def _enter_busy(self) -> None:
        """A first wait began: start the watcher, or wake it (see `_check_alive`)."""
        with self._watch:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._check_alive, daemon=True,
                                                 name="fiberexec-mp-heartbeat")
                self._watcher.start()
            self._watch.notify_all()

    def _check_alive(self) -> None:
        """While calls wait, ask the server every beat whether it lives; if not, lose it."""
        while True:
            with self._watch:
                self._idle = True  # set before the check: see `_Busy.__enter__`
                self._watch.wait_for(lambda: self._busy > 0 or self._closed)
                self._idle = False
                if self._closed:
                    return
            if self.lost.wait(_timing.TIMING.heartbeat):
                return
            with self._watch:
                if self._busy == 0:
                    continue
            try:
                self._roundtrip(_frame(b"R", (Ping(), (_TOKEN, 0)), b""), _timing.TIMING.ping)
            except ConnectionError:
                if not self._closed:
                    self._lose(f"the process serving {self.address} stopped answering (no "
                               f"reply to a liveness check within {_timing.TIMING.ping}s): it died "
                               "or hangs")
                return

    def call(self, call: Call, body: bytes = b"", *,
             timeout: float | EllipsisType | None = ...) -> tuple[Any, bytes]:
        """Make ``call`` on the server, waiting ``timeout`` for the answer (None: for ever;
        unsaid: `Timing.call`); re-raise what it raised."""
        if timeout is ...:
            timeout = _timing.TIMING.call
        caller = (_TOKEN, threading.get_ident())
        with self.busy():
            answer = self._roundtrip(_frame(b"R", (call, caller), body), timeout)
        tag = answer[:1]
        if tag == b"O":
            head, out = _split(answer)
            return head, bytes(out)
        if tag == b"E":
            raise pickle.loads(answer[1:])
        raise ProtocolError(f"{self.address} answered {tag!r}: {answer[1:200]!r}")

    def on_lost(self, fn: Callable[[], None]) -> None:
        self.listeners.append(fn)
        if self.lost.is_set():
            fn()

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.why = why
            self.lost.set()
        for fn in list(self.listeners):
            fn()
        self._close_channels()  # wake the calls waiting for an answer

    def _close_channels(self) -> None:
        with self._lock:
            channels = list(self._channels)
        for channel in channels:
            drop(channel.sock)

    def close(self) -> None:
        with self._watch:
            self._closed = True
            self._watch.notify_all()
        with self._lock:
            self.lost.set()
        drop(self._monitor)
        self._close_channels()


class Endpoint:
    """A server seen from here: called directly when it lives in this process."""

    def __init__(self, address: str, secret: bytes) -> None:
        self.address = address
        self.secret = secret

    def call(self, call: Call, body: bytes = b"", *,
             timeout: float | EllipsisType | None = ...) -> tuple[Any, bytes]:
        server = _local_servers.get(self.address)
        if server is not None and server.secret == self.secret:
            return server.call_local(call, body)
        return client_for(self.address, self.secret).call(call, body, timeout=timeout)


def client_for(address: str, secret: bytes) -> RpcClient:
    """This process's connection to ``address`` (one per address, made on first use)."""
    client = _clients.get(address)  # the common case, without the lock: it lives
    if client is not None and not client.lost.is_set():
        return client
    with _clients_lock:
        client = _clients.get(address)
        if client is not None and not client.lost.is_set():
            return client
        # a lost client is closed only once its successor's monitor is open: its server
        # would take this process for gone in between (`Callers`); if none can be made,
        # the lost one stays, to be replaced by a later call
        fresh = _clients[address] = RpcClient(address, secret)
        if client is not None:
            client.close()
        return fresh
