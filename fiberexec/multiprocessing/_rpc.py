"""Authenticated request/reply over pynng: the transport of queues, pipes, processes, managers.

    client (Req0, a context per thread)          server (Rep0, a thread per request in flight)
      | -- b"H" nonce_c ---------------------> |   nothing is trusted yet; frames are raw
      | <-- b"C" nonce_s HMAC("mp-server") --- |   the server proves it holds the secret
      | -- b"A" HMAC("mp-client") -----------> |   the client proves it; its pipe is trusted
      | <-- b"K" ----------------------------- |
      | -- b"R" len head body ---------------> |   head: pickled (op, args, caller)
      | <-- b"O" len head body / b"E" error -- |

Only frames from an authenticated pipe are unpickled; anything else is answered with
``b"D"`` and its pipe closed. Each request runs on its own server thread, so one blocking
request (a ``get`` waiting for an item) never holds up the others; a new receiving thread is
started whenever none is idle. Servers that live in this process are called directly.

A server that dies normally closes its connection, and every call waiting on it raises
`ConnectionError` at once. One that dies silently (its host or container vanished, or it
stopped) is found by the client: while calls are waiting, it asks the server every
``HEARTBEAT`` seconds whether it is alive (``b"R"`` op ``"__ping__"``, answered by the
transport itself); no answer within ``PING_TIMEOUT`` and the client is declared lost, which
wakes every waiting call with a `ConnectionError` that names the server.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import secrets
import struct
import threading
from collections.abc import Callable
from typing import Any

import pynng

from fiberexec import _auth
from fiberexec._errors import ProtocolError
from fiberexec.multiprocessing._cond import Condition
from fiberexec.multiprocessing._errors import AuthenticationError

log = logging.getLogger("fiberexec.multiprocessing")
MAX_MESSAGE = 1 << 31
MAX_THREADS = 1024
CALL_TIMEOUT = 120.0  # seconds an answer may take beyond the time the request asks to wait
HEARTBEAT = 5.0  # seconds a call waits before the client checks that its server is alive
PING_TIMEOUT = 30.0  # seconds a live server has to answer that check
PING = "__ping__"
_LEN = struct.Struct("!I")
Caller = tuple[str, int]  # (client token, thread id): who holds a remote lock
Handler = Callable[[str, tuple[Any, ...], bytes, Caller], tuple[Any, bytes]]

_local_servers: dict[str, RpcServer] = {}
_clients: dict[str, RpcClient] = {}
# re-entrant: a garbage collection inside it (say while a client is made) may run a dropped
# manager's or proxy's finalizer in this very thread, and that calls a server too
_clients_lock = threading.RLock()
_TOKEN = secrets.token_hex(8)


def _frame(tag: bytes, head: Any, body: bytes | memoryview) -> list[bytes | memoryview]:
    data = pickle.dumps(head, protocol=5)
    return [tag, _LEN.pack(len(data)), data, body]


def _split(frame: bytes) -> tuple[Any, memoryview]:
    view = memoryview(frame)
    (size,) = _LEN.unpack_from(view, 1)
    head = pickle.loads(view[1 + _LEN.size : 1 + _LEN.size + size])
    return head, view[1 + _LEN.size + size :]


class RpcServer:
    """Serve ``handler(op, args, body, caller) -> (result, body)`` to authenticated clients."""

    def __init__(self, secret: bytes, handler: Handler, host: str = "127.0.0.1") -> None:
        self.secret = secret
        self.handler = handler
        self._sock = pynng.Rep0(recv_max_size=MAX_MESSAGE)
        self._sock.add_post_pipe_remove_cb(self._forget_pipe)
        bracketed = f"[{host}]" if ":" in host else host
        listener = self._sock.listen(f"tcp://{bracketed}:0")
        self.port = int(str(listener.local_address).rsplit(":", 1)[1])
        self.address = f"tcp://{bracketed}:{self.port}"
        self.rejected = 0
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[bytes, bytes]] = {}
        self._trusted: set[int] = set()
        self._contexts: list[Any] = []
        self._idle = 0
        self._closed = False
        self._threads: list[threading.Thread] = []
        _local_servers[self.address] = self
        self._spawn()

    def advertised(self, host: str) -> str:
        """The address clients elsewhere dial: this server's port on ``host``."""
        return f"tcp://{f'[{host}]' if ':' in host else host}:{self.port}"

    def _spawn(self) -> None:
        ctx = self._sock.new_context()
        self._contexts.append(ctx)
        thread = threading.Thread(target=self._serve, args=(ctx,), daemon=True,
                                  name="fiberexec-mp-rpc")
        self._threads.append(thread)
        thread.start()

    def _serve(self, ctx: Any) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                msg = ctx.recv_msg()
            except (pynng.NNGException, TypeError):  # TypeError: pynng's closed context
                return
            with self._lock:
                self._idle -= 1
                if self._idle == 0 and not self._closed and len(self._threads) < MAX_THREADS:
                    self._spawn()
            reply = self._answer(msg.bytes, msg.pipe)
            try:
                ctx.send(reply)
            except (pynng.NNGException, TypeError):
                return

    def _answer(self, frame: bytes, pipe: Any) -> bytes:
        tag = frame[:1]
        with self._lock:
            trusted = pipe.id in self._trusted
        if trusted and tag == b"R":
            return self._dispatch(frame)
        if not trusted and tag == b"H" and len(frame) == 17:
            return self._challenge(pipe, frame[1:])
        if not trusted and tag == b"A" and len(frame) == 33:
            return self._check(pipe, frame[1:])
        return self._reject(pipe, f"unexpected {tag!r} frame before authentication")

    def _challenge(self, pipe: Any, nonce_c: bytes) -> bytes:
        nonce_s = _auth.new_nonce()
        with self._lock:
            self._pending[pipe.id] = (nonce_c, nonce_s)
        return b"C" + nonce_s + _auth.proof(self.secret, "mp-server", nonce_c, nonce_s)

    def _check(self, pipe: Any, proof: bytes) -> bytes:
        with self._lock:
            nonces = self._pending.pop(pipe.id, None)
        if nonces is None or not _auth.verify(_auth.proof(self.secret, "mp-client", *nonces),
                                              proof):
            return self._reject(pipe, "wrong proof")
        with self._lock:
            self._trusted.add(pipe.id)
        return b"K"

    def _reject(self, pipe: Any, why: str) -> bytes:
        self.rejected += 1
        log.warning("rejected a connection to %s: %s", self.address, why)
        threading.Timer(0.05, _close_quietly, args=(pipe,)).start()  # after the reply leaves
        return b"D" + why.encode()

    def _forget_pipe(self, pipe: Any) -> None:
        with self._lock:
            self._trusted.discard(pipe.id)
            self._pending.pop(pipe.id, None)

    def _dispatch(self, frame: bytes) -> bytes:
        try:
            (op, args, caller), body = _split(frame)
            if op == PING:
                return b"".join(_frame(b"O", None, b""))
            result, out = self.handler(op, args, bytes(body), caller)
            return b"".join(_frame(b"O", result, out))
        except BaseException as exc:  # the caller re-raises it
            return b"E" + _pickle_error(exc)

    def call_local(self, op: str, args: tuple[Any, ...], body: bytes) -> tuple[Any, bytes]:
        return self.handler(op, args, body, (_TOKEN, threading.get_ident()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            contexts, self._contexts = self._contexts, []
        _local_servers.pop(self.address, None)
        for ctx in contexts:
            with contextlib.suppress(pynng.NNGException):
                ctx.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        self._sock.close()


def _set_timeout(ctx: Any, ms: int) -> None:
    """Bound a context's send and receive (pynng's `Context` has no timeout attributes)."""
    if getattr(ctx, "_fiberexec_timeout", None) == ms:
        return
    for option in (b"recv-timeout", b"send-timeout"):
        err = pynng.lib.nng_ctx_set_ms(ctx.context, option, ms)
        if err:
            pynng.check_err(err)
    ctx._fiberexec_timeout = ms


def _close_quietly(pipe: Any) -> None:
    with contextlib.suppress(Exception):
        pipe.close()


def _pickle_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc, protocol=5)
    except Exception:
        from fiberexec.multiprocessing._errors import RemoteError

        return pickle.dumps(RemoteError(f"{type(exc).__name__}: {exc}"), protocol=5)


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


class RpcClient:
    """One authenticated Req0 connection to a server; thread-safe (a context per thread)."""

    def __init__(self, address: str, secret: bytes, *, timeout: float = 30.0) -> None:
        self.address = address
        self.lost = threading.Event()
        self._sock = pynng.Req0(recv_max_size=MAX_MESSAGE, resend_time=-1)
        self._sock.add_post_pipe_remove_cb(self._on_remove)
        self._listeners: list[Callable[[], None]] = []
        self._local = threading.local()
        self._contexts: list[Any] = []
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
        self._sock.dial_timeout = int(timeout * 1000)
        try:
            self._sock.dial(address, block=True)
        except pynng.NNGException as exc:
            self._sock.close()
            raise ConnectionError(f"cannot reach {address}: {exc}; is its owner alive?") from exc
        try:
            self._handshake(secret, timeout)
        except BaseException:
            self.close()
            raise

    def _context(self) -> Any:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            with self._lock:
                if self.lost.is_set():
                    raise ConnectionError(self.why)
                ctx = self._local.ctx = self._sock.new_context()
                self._contexts.append(ctx)
        return ctx

    def _roundtrip(self, parts: list[bytes | memoryview], timeout: float | None) -> bytes:
        ctx = self._context()
        _set_timeout(ctx, -1 if timeout is None else max(1, int(timeout * 1000)))
        try:
            ctx.send(b"".join(parts) if len(parts) > 1 else parts[0])
            return bytes(ctx.recv())
        except pynng.Timeout:
            raise ConnectionError(
                f"{self.address} did not answer within {timeout}s; is its owner alive?"
            ) from None
        except (pynng.NNGException, TypeError):  # TypeError: pynng's closed context
            raise ConnectionError(self.why) from None

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
            if self.lost.wait(HEARTBEAT):
                return
            with self._watch:
                if self._busy == 0:
                    continue
            try:
                self._roundtrip(_frame(b"R", (PING, (), (_TOKEN, 0)), b""), PING_TIMEOUT)
            except ConnectionError:
                if not self._closed:
                    self._lose(f"the process serving {self.address} stopped answering (no "
                               f"reply to a liveness check within {PING_TIMEOUT}s): it died "
                               "or hangs")
                return

    def _handshake(self, secret: bytes, timeout: float) -> None:
        nonce_c = _auth.new_nonce()
        answer = self._roundtrip([b"H" + nonce_c], timeout)
        if answer[:1] != b"C" or len(answer) != 49:
            raise AuthenticationError(f"{self.address} did not answer the handshake")
        nonce_s, proof = answer[1:17], answer[17:]
        if not _auth.verify(_auth.proof(secret, "mp-server", nonce_c, nonce_s), proof):
            raise AuthenticationError(
                f"{self.address} failed authentication: it does not hold this handle's secret"
            )
        ok = self._roundtrip([b"A" + _auth.proof(secret, "mp-client", nonce_c, nonce_s)],
                             timeout)
        if ok != b"K":
            raise AuthenticationError(f"{self.address} refused our proof: {ok[1:]!r}")

    def call(self, op: str, args: tuple[Any, ...], body: bytes = b"", *,
             timeout: float | None = CALL_TIMEOUT) -> tuple[Any, bytes]:
        """Run ``op`` on the server; re-raise what it raised."""
        caller = (_TOKEN, threading.get_ident())
        with self.busy():
            answer = self._roundtrip(_frame(b"R", (op, args, caller), body), timeout)
        tag = answer[:1]
        if tag == b"O":
            head, out = _split(answer)
            return head, bytes(out)
        if tag == b"E":
            raise pickle.loads(answer[1:])
        raise ProtocolError(f"{self.address} answered {tag!r}: {answer[1:200]!r}")

    def on_lost(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)
        if self.lost.is_set():
            fn()

    def _on_remove(self, _pipe: Any) -> None:
        self._lose(f"the process serving {self.address} is gone (its connection closed)")

    def _lose(self, why: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.why = why
            self.lost.set()
        for fn in list(self._listeners):
            fn()
        threading.Thread(target=self._close_contexts, daemon=True).start()  # wake waiters

    def _close_contexts(self) -> None:
        with self._lock:
            contexts, self._contexts = self._contexts, []
        for ctx in contexts:
            with contextlib.suppress(pynng.NNGException):
                ctx.close()

    def close(self) -> None:
        with self._watch:
            self._closed = True
            self._watch.notify_all()
        self._close_contexts()
        self._sock.close()


class Endpoint:
    """A server seen from here: called directly when it lives in this process."""

    def __init__(self, address: str, secret: bytes) -> None:
        self.address = address
        self.secret = secret

    def call(self, op: str, args: tuple[Any, ...], body: bytes = b"", *,
             timeout: float | None = CALL_TIMEOUT) -> tuple[Any, bytes]:
        server = _local_servers.get(self.address)
        if server is not None and server.secret == self.secret:
            return server.call_local(op, args, body)
        return client_for(self.address, self.secret).call(op, args, body, timeout=timeout)


def client_for(address: str, secret: bytes) -> RpcClient:
    """This process's connection to ``address`` (one per address, made on first use)."""
    with _clients_lock:
        client = _clients.get(address)
        if client is not None and client.lost.is_set():
            client.close()
            client = None
        if client is None:
            client = _clients[address] = RpcClient(address, secret)
        return client


def close_clients() -> None:
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
