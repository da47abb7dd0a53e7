"""`Queue`, `SimpleQueue`, `JoinableQueue`: handles on a queue held by a broker.

The queue lives in the broker of the process that created it; handles pickle to the
broker's address, secret and the queue's id, so they can be passed to `Process`es and `Pool`
tasks on any backend. Items are pickled by the sender and unpickled by the receiver only.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from fiberexec._serialize import dumps_as_stdlib, loads_as_stdlib
from fiberexec.multiprocessing import _broker as b
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _channels as ch
from fiberexec.multiprocessing import _stream as st
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._rpc import Endpoint

_CREATING = threading.Lock()  # held while a queue is made in its broker, on first use


class Queue:
    """A FIFO shared by processes (`multiprocessing.Queue`).

    ``put``/``get`` take ``block`` and ``timeout`` and raise `queue.Full` / `queue.Empty`;
    ``qsize``, ``empty`` and ``full`` are exact (the broker owns the queue).
    """

    def __init__(self, maxsize: int = 0, *, ctx: object = None) -> None:
        if not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {maxsize!r}")
        self._maxsize = maxsize if maxsize > 0 else 0
        self._endpoint: Endpoint | None = None
        self._cid = 0
        self._closed = False

    def _ep(self) -> Endpoint:
        endpoint = self._endpoint
        if endpoint is None:
            with _CREATING:  # threads that first use it at once: one makes it, for all
                if self._endpoint is None:
                    broker = b.get_broker()
                    self._cid = broker.endpoint.call(calls.NewChan(self._maxsize, -1))[0]
                    self._endpoint = broker.endpoint  # after the id: read without the lock
                endpoint = self._endpoint
        return endpoint

    def _call(self, kind: Callable[..., calls.Call], *args: Any, body: bytes = b"",
              wait: float = 0.0) -> tuple[Any, bytes]:
        """``kind(cid, *args)`` on the queue's broker."""
        if self._closed:
            raise self._closed_error()
        try:
            endpoint = self._ep()
            return endpoint.call(kind(self._cid, *args), body, timeout=wait + _timing.TIMING.call)
        except ConnectionError as exc:
            raise _gone(self, exc) from exc

    def _closed_error(self) -> Exception:
        """What a use after `close` raises (the stdlib's `Queue`: ValueError)."""
        return ValueError(f"{type(self).__name__} {self!r} is closed")

    def __reduce__(self) -> tuple[Any, ...]:
        ep = self._ep()
        return (_rebuild, (type(self), ep.address, ep.secret, self._cid, self._maxsize))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self._cid} maxsize={self._maxsize}>"

    # The standard library's queues are a pipe and two locks, and code written against it
    # reaches for them: `concurrent.futures.ProcessPoolExecutor` waits on
    # ``result_queue._reader`` with `multiprocessing.connection.wait`, and
    # `multiprocessing.pool.Pool` sends with ``_writer.send`` and receives with
    # ``_reader.recv`` when given this module's context. They are views on this queue.

    def _ends(self) -> tuple[QueueReader, QueueWriter]:
        ends: tuple[QueueReader, QueueWriter] | None = self.__dict__.get("_ends_")
        if ends is None:  # made on first use: a handle unpickled elsewhere has none yet
            ends = self.__dict__["_ends_"] = (QueueReader(self), QueueWriter(self))
        return ends

    _reader = property(lambda self: self._ends()[0])
    _writer = property(lambda self: self._ends()[1])

    @property
    def _rlock(self) -> Any:
        """The stdlib's lock around a get. Gets here are atomic without one: this is a lock
        of this process only, for code that takes it (``Pool`` does when terminating)."""
        return self.__dict__.setdefault("_rlock_", threading.Lock())

    @property
    def _wlock(self) -> Any:
        """As `_rlock`, around a put."""
        return self.__dict__.setdefault("_wlock_", threading.Lock())

    def _poll(self, timeout: float | None = 0.0) -> bool:
        """Whether an item is waiting, waiting up to ``timeout`` (None: forever).

        In the creating process an item anywhere in the queue counts; elsewhere, an item
        already sent to this process or held by the creator (not those sent ahead to other
        consumers)."""
        if self._closed:
            raise self._closed_error()
        broker = b.local_broker(self._ep())
        if broker is not None:
            ready = broker.channels.ready(self._cid, timeout)
            if not ready and timeout == 0.0:
                os.sched_yield()  # (as `qsize`: a loop on it lets the other threads run)
            return ready
        stream = st.stream_for(self._ep())
        if stream is not None and stream.holds(self._cid):
            return True
        return _blocking(timeout != 0.0, timeout,
                         lambda w: bool(self._call(calls.Poll, w, wait=w)[0]))

    _streamed = True  # an unbounded put needs no answer: it may go over the stream

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Put ``obj``; with a full bounded queue wait up to ``timeout``, then `queue.Full`.

        Into an unbounded queue created by another process, ``put`` sends the item and
        returns (as the standard library's feeder thread does); items from one process
        arrive in the order they were put.
        """
        self._put_raw(dumps_as_stdlib(obj, what="queue item"), block, timeout)

    def _put_raw(self, data: bytes, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            raise self._closed_error()
        broker = b.local_broker(self._ep())  # created here: its channels directly, no RPC
        if not self._maxsize:
            if broker is not None:
                broker.channels.append(self._cid, data)
                return
            if self._streamed:
                try:
                    stream = st.stream_for(self._ep())
                    if stream is not None:  # to its only consumer directly, if it can
                        stream.put(self._cid, data, queue=True)
                        return
                except ConnectionError as exc:
                    raise _gone(self, exc) from exc

        def attempt(wait: float) -> bool:
            status = (self._call(calls.Put, wait, body=data, wait=wait)[0] if broker is None
                      else broker.channels.put(data, self._cid, wait))
            return bool(status == ch.OK)

        if not _blocking(block, timeout, attempt):
            raise queue.Full

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return an item; `queue.Empty` if none arrives within ``timeout``."""
        return loads_as_stdlib(self._get_raw(block, timeout))

    def _get_raw(self, block: bool = True, timeout: float | None = None) -> bytes:
        if self._closed:
            raise self._closed_error()
        broker = b.local_broker(self._ep())
        try:
            consumer = st.stream_for(self._ep()) if broker is None else None
            if consumer is not None:
                data = (consumer.get(self._cid, None if timeout is None else max(0.0, timeout))
                        if block else consumer.get_nowait(self._cid))
                if data is not None:
                    return data
                if block:
                    raise queue.Empty
        except ConnectionError as exc:
            raise _gone(self, exc) from exc
        found: list[bytes] = []

        def attempt(wait: float) -> bool:
            status, body = (self._call(calls.Get, wait, wait=wait) if broker is None
                            else broker.channels.get(self._cid, wait))  # (as `_put_raw`)
            if status == ch.OK:
                found.append(body)
            return bool(status == ch.OK)

        if not _blocking(block, timeout, attempt):
            raise queue.Empty
        return found[0]

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, block=False)

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        size, _maxsize = self._call(calls.QSize)[0]
        if b.local_broker(self._ep()) is not None:
            # Answered here with no system call, where the standard library's makes one
            # (``empty`` polls its pipe): let this process's other threads run, or a loop
            # on it (``while q.empty(): pass``) keeps the interpreter's lock from the thread
            # taking in what it waits for until the switch interval ends, for every item
            # (7.6 ms an item against 0.3, measured)
            os.sched_yield()
        return int(size)

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return bool(self._maxsize) and self.qsize() >= self._maxsize

    def close(self) -> None:
        """This handle sends no more; other handles keep working."""
        self._closed = True

    def join_thread(self) -> None:
        """Nothing to join: ``put`` delivers before it returns (no feeder thread). As the
        stdlib's, only after `close`."""
        if not self._closed:
            raise AssertionError(f"Queue {self!r} not closed")

    def cancel_join_thread(self) -> None:
        """Nothing to cancel (no feeder thread)."""


class SimpleQueue(Queue):
    """An unbounded queue with ``get``, ``put``, ``empty`` and ``close``.

    ``get`` also takes ``block`` and ``timeout`` (the standard library's takes neither) and
    raises `queue.Empty` when nothing arrives in time.
    """

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__(0)

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(obj)

    def _closed_error(self) -> Exception:
        return OSError("handle is closed")  # the stdlib's: its pipe's ends are closed


class JoinableQueue(Queue):
    """A `Queue` with ``task_done`` and ``join`` (`multiprocessing.JoinableQueue`)."""

    _streamed = False  # join() must see every put() that returned

    def task_done(self) -> None:
        """Mark one item as processed; ValueError if called more times than items put.

        In a process that took more items than it marked done, the mark goes on its stream
        to the queue's creator with no answer to wait for (the stdlib's is a semaphore's
        decrement, no round trip either); a `join` counts it once it arrives."""
        if self._closed:
            raise self._closed_error()
        broker = b.local_broker(self._ep())
        if broker is not None:
            broker.channels.task_done(self._cid)
            return
        try:
            stream = st.stream_for(self._ep())
            marked = 0 if stream is None else stream.task_done(self._cid)
        except ConnectionError as exc:
            raise _gone(self, exc) from exc
        if marked is not None:
            self._call(calls.TaskDone, marked)

    def join(self, timeout: float | None = None) -> bool | None:
        """Block until every item put has been marked done; None, as the stdlib's. With
        ``timeout`` (an extension): whether they were, within it."""
        done = _blocking(True, timeout, lambda w: bool(self._call(calls.Join, w, wait=w)[0]))
        return None if timeout is None else done


class _End:
    """One of a queue's stdlib-style pipe ends (see `Queue._reader`). Closing it closes this
    view only: the stdlib's pool workers close the ends they do not use, and their queue
    keeps working."""

    def __init__(self, q: Queue) -> None:
        self._queue = q
        self.closed = False
        self._signalled = False  # fileno() made the broker's signal for the queue

    def _open(self) -> Queue:
        if self.closed:
            raise OSError("handle is closed")
        return self._queue

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._queue!r}>"


class QueueReader(_End):
    """``queue._reader``: ``recv``, ``recv_bytes``, ``poll`` and ``fileno`` on the queue."""

    readable, writable = True, False

    def recv(self) -> Any:
        return self._open().get()

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        """The next item as the pickle it travels as."""
        data = self._open()._get_raw()
        if maxlength is not None and len(data) > maxlength:
            raise OSError(f"item of {len(data)} bytes is longer than maxlength={maxlength}")
        return data

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self._open()._poll(timeout)

    def fileno(self) -> int:
        """A descriptor readable while the queue has an item, for `select` and
        `multiprocessing.connection.wait`: in the process that created the queue only
        (elsewhere items are sent to a consumer only once it asks, so no descriptor can
        tell whether one is waiting without taking it)."""
        q = self._open()
        broker = b.local_broker(q._ep())
        if broker is None:
            raise OSError(
                f"fileno() of {q!r}'s reader is available in the process that created the "
                "queue only; elsewhere use poll(timeout) or get(timeout=...)")
        self._signalled = True
        return broker.channels.signal(q._cid)

    def close(self) -> None:
        if not self.closed and self._signalled:
            broker = b.local_broker(self._queue._ep())
            if broker is not None:
                broker.channels.drop_signal(self._queue._cid)
        super().close()


class QueueWriter(_End):
    """``queue._writer``: ``send`` and ``send_bytes`` put into the queue."""

    readable, writable = False, True

    def send(self, obj: Any) -> None:
        self._open().put(obj)

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Put the pickle ``buf`` (a getter unpickles it), as the stdlib's queues do."""
        view = memoryview(buf).cast("B")
        end = len(view) if size is None else offset + size
        if offset < 0 or end > len(view) or end < offset:
            raise ValueError(f"offset={offset}, size={size} out of range for {len(view)} bytes")
        self._open()._put_raw(bytes(view[offset:end]))


def _gone(q: Queue, exc: ConnectionError) -> ConnectionError:
    """The error for a queue whose creating process (which holds its items) is gone."""
    return type(exc)(f"the process that created {type(q).__name__} {q._cid} is gone or not "
                     f"answering; its items are lost ({exc})")


def _blocking(block: bool, timeout: float | None, attempt: Any) -> bool:
    if not block:
        return bool(attempt(0.0))
    return _timing.in_slices(timeout, attempt)


def _rebuild(cls: type[Queue], address: str, secret: bytes, cid: int, maxsize: int) -> Queue:
    q = cls.__new__(cls)
    q._maxsize, q._cid, q._closed = maxsize, cid, False
    q._endpoint = Endpoint(address, secret)
    return q
