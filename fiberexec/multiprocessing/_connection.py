"""`Pipe` and `Connection` across hosts: two broker channels, one per direction, with
end-of-file (on one host, `Pipe` makes the standard library's socket pipe: `_hostpipe`).

Each direction counts the open `Connection` objects that may send into it (a pickled copy
holds its own count, taken when it is pickled); when the last is closed or collected, or
the process holding it ends, the other end's ``recv`` raises `EOFError` once the data
already sent is read. In the creating process an end talks to the broker by direct calls;
anywhere else it uses that process's `_stream` to the creator (no round trip per message).
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import threading
import weakref
from typing import Any

from fiberexec._serialize import dumps_as_stdlib, loads_as_stdlib
from fiberexec.multiprocessing import _broker as b
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _channels as ch
from fiberexec.multiprocessing import _stream as st
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._errors import BufferTooShort
from fiberexec.multiprocessing._frames import Claim, Release
from fiberexec.multiprocessing._rpc import Endpoint, process_token


class Connection:
    """One end of a `Pipe` (`multiprocessing.connection.Connection`)."""

    def __init__(self, endpoint: Endpoint, recv_id: int | None, send_id: int | None) -> None:
        self._endpoint = endpoint
        self._recv_id, self._send_id = recv_id, send_id
        self._closer: weakref.finalize | None = None  # type: ignore[type-arg]
        self._ticket = secrets.token_hex(8)
        self._stream = st.stream_for(endpoint)  # None in the creating process
        self._broker = b.local_broker(endpoint) if self._stream is None else None
        self._subscribed = False
        if send_id is not None:
            _start_releaser()
            self._closer = weakref.finalize(self, _released.put, (endpoint, send_id))
            # not at exit: the releaser would race the transport's own shutdown (a child
            # closes its ends explicitly first, see `release_all`)
            self._closer.atexit = False
            _open.add(self)

    readable = property(lambda self: self._recv_id is not None)
    writable = property(lambda self: self._send_id is not None)

    @property
    def closed(self) -> bool:
        return self._recv_id is None and self._send_id is None

    def __repr__(self) -> str:
        return f"<Connection recv={self._recv_id} send={self._send_id}>"

    def __reduce__(self) -> tuple[Any, ...]:
        ticket = ""
        if self._send_id is not None:  # the copy holds its own count on our direction
            ticket = self._ticket
            while not self._endpoint.call(calls.Ref(self._send_id, ticket))[0]:
                ticket = self._ticket = secrets.token_hex(8)
        ep = self._endpoint
        capture = getattr(_capture, "tickets", None)
        if capture is not None and ticket:
            capture.append((ep.address, self._send_id, ticket))
        return (_rebuild, (ep.address, ep.secret, self._recv_id, self._send_id, ticket))

    def _check(self, readable: bool) -> int:
        cid = self._recv_id if readable else self._send_id
        if self.closed:
            raise OSError("handle is closed")
        if cid is None:
            raise OSError(f"connection is {'write' if readable else 'read'}-only")
        return cid

    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        self.send_bytes(dumps_as_stdlib(obj, what="object sent through the pipe"))

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Send bytes from a bytes-like object (``offset``/``size`` select a slice)."""
        cid = self._send_id
        if cid is None:
            cid = self._check(readable=False)  # raises
        if type(buf) is bytes and offset == 0 and size is None:
            data = buf  # the common case: nothing to check or copy
        else:
            data = _slice(buf, offset, size)
        if self._stream is not None:
            self._stream.put(cid, data)
        elif self._broker is not None:
            if self._recv_id is not None:
                self._broker.channels.expect(self._recv_id)
            self._broker.channels.append(cid, data)
        else:
            self._endpoint.call(calls.Put(cid, 0.0), data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        """Receive one message as bytes; `EOFError` when the other end is closed."""
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self._receive()
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Receive into ``buf`` at ``offset``; `BufferTooShort` (with the message) if small."""
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset out of bounds" if offset >= 0 else "negative offset")
        data = self._receive()
        if len(data) > len(view) - offset:
            raise BufferTooShort(data)
        view[offset:offset + len(data)] = data
        return len(data)

    def recv(self) -> Any:
        """Receive one object sent with `send`; `EOFError` when the other end is closed."""
        return loads_as_stdlib(self._receive())

    def _subscribe(self, stream: st.Stream, cid: int) -> None:
        if not self._subscribed:
            stream.subscribe(cid)
            self._subscribed = True

    def _receive(self) -> bytes:
        cid = self._recv_id
        if cid is None:
            cid = self._check(readable=True)  # raises
        if self._stream is not None:
            if not self._subscribed:
                self._subscribe(self._stream, cid)
            return self._stream.take(cid)
        if self._broker is not None:
            return self._broker.channels.take_item(cid)
        found: list[tuple[str, bytes]] = []

        def attempt(wait: float) -> bool:
            status, body = self._endpoint.call(calls.Get(cid, wait),
                                               timeout=wait + _timing.TIMING.call)
            found.append((status, body))
            return bool(status != ch.EMPTY)

        _timing.in_slices(None, attempt)
        status, body = found[-1]
        if status == ch.EOF:
            raise EOFError
        return body

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether data (or end-of-file) is waiting; wait up to ``timeout`` (None: forever)."""
        cid = self._check(readable=True)
        stream, broker = self._stream, self._broker
        if stream is not None:
            self._subscribe(stream, cid)
            ready = stream.wait(cid, timeout)
        elif broker is not None:
            ready = broker.channels.ready(cid, timeout)
        else:
            return _timing.in_slices(timeout, lambda w: bool(
                self._endpoint.call(calls.Poll(cid, w), timeout=w + _timing.TIMING.call)[0]))
        if not ready and timeout == 0.0:
            # answered here with no system call, where the stdlib's polls its socket: a loop
            # on it lets the thread that takes in what it waits for run (as a queue's
            # ``empty``, see `_queues.Queue.qsize`)
            os.sched_yield()
        return ready

    def fileno(self) -> int:
        """A descriptor readable exactly while `recv` would not block (data or end-of-file
        waiting), for `select`, selectors and `multiprocessing.connection.wait`."""
        cid = self._check(readable=True)
        if self._stream is not None:
            self._subscribe(self._stream, cid)
            return self._stream.signal(cid)
        if self._broker is not None:
            return self._broker.channels.signal(cid)
        raise OSError("fileno() is not available for this pipe end")

    def close(self) -> None:
        """Close this end; once every copy of it is closed, the other end sees EOF."""
        if self._closer is not None and self._closer.detach() is not None:
            _release(self._endpoint, self._send_id)  # type: ignore[arg-type]
        if self._subscribed and self._stream is not None and self._recv_id is not None:
            self._stream.unsubscribe(self._recv_id)
            self._stream.drop_signal(self._recv_id)
            self._subscribed = False
        if self._broker is not None and self._recv_id is not None:
            self._broker.channels.drop_signal(self._recv_id)
        self._recv_id = self._send_id = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_capture = threading.local()  # .tickets: pipe ends pickled into a Process payload


def capture_tickets() -> list[tuple[str, int, str]]:
    """Start recording the ends this thread pickles (see `Process.start`)."""
    tickets: list[tuple[str, int, str]] = []
    _capture.tickets = tickets
    return tickets


def stop_capture() -> None:
    _capture.tickets = None


def release_all() -> None:
    """Close every connection end still open here (a `Process` child does it on exit)."""
    for conn in list(_open):
        conn.close()


# An end collected by the garbage collector is released by a thread of its own: the
# collector may run anywhere, even while this thread holds a lock `_release` needs.
# At exit it stops (after the release under way, if any), before the transport shuts down.
_released: queue.SimpleQueue[tuple[Endpoint, int]] = queue.SimpleQueue()
_releaser: list[threading.Thread] = []
_releaser_lock = threading.Lock()
_releasing = threading.Lock()  # held while the releaser releases
_exiting = threading.Event()


def _start_releaser() -> None:
    if _releaser:
        return
    with _releaser_lock:
        if not _releaser:
            _releaser.append(threading.Thread(target=_release_collected, daemon=True,
                                              name="fiberexec-mp-release"))
            _releaser[0].start()
            atexit.register(_stop_releaser)  # runs before the transport's own exit hook


def _stop_releaser() -> None:
    _exiting.set()
    if _releasing.acquire(timeout=_timing.TIMING.release):
        _releasing.release()


def _release_collected() -> None:
    while True:
        endpoint, cid = _released.get()
        with _releasing:
            if _exiting.is_set():
                return
            _release(endpoint, cid)


def _release(endpoint: Endpoint, cid: int) -> None:
    broker = b.local_broker(endpoint)
    if broker is not None:  # never through the network to ourselves (nor once closed)
        broker.channels.unref(cid, process_token())
        return
    try:
        stream = st.stream_for(endpoint)
        if stream is not None:
            stream.send(Release(cid))
        else:
            endpoint.call(calls.Unref(cid), timeout=_timing.TIMING.release)
    except Exception:  # the broker is gone: nobody is left to tell
        pass


def _rebuild(address: str, secret: bytes, recv_id: int | None, send_id: int | None,
             ticket: str) -> Connection:
    endpoint = Endpoint(address, secret)
    if send_id is not None:
        stream = st.stream_for(endpoint)
        if stream is not None:
            stream.send(Claim(send_id, ticket))
        else:
            endpoint.call(calls.Claim(send_id, ticket))
    return Connection(endpoint, recv_id, send_id)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:  # stdlib name
    """Two connected `Connection` objects; with ``duplex=False``, (reader, writer).

    Where every process runs on this host, the standard library's socket pipe
    (`_hostpipe`); otherwise two channels of the broker."""
    from fiberexec.multiprocessing import _backends, _hostpipe

    if _hostpipe.usable(_backends.broker_hosts()[1]):
        return _hostpipe.pipe(duplex)
    broker = b.get_broker()
    ep = broker.endpoint
    forward = ep.call(calls.NewChan(0, 1))[0]
    if not duplex:
        return Connection(ep, forward, None), Connection(ep, None, forward)
    backward = ep.call(calls.NewChan(0, 1))[0]
    return Connection(ep, backward, forward), Connection(ep, forward, backward)


def _slice(buf: Any, offset: int, size: int | None) -> bytes:
    """``buf[offset:offset + size]`` as bytes, checked as the standard library does."""
    view = memoryview(buf).cast("B")
    if offset < 0:
        raise ValueError("offset is negative")
    if len(view) < offset:
        raise ValueError("buffer length < offset")
    size = len(view) - offset if size is None else size
    if size < 0:
        raise ValueError("size is negative")
    if offset + size > len(view):
        raise ValueError("buffer length < offset + size")
    return bytes(view[offset:offset + size])
