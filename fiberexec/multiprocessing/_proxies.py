"""Manager proxies: references to objects in a manager's server, with the stdlib's operators.

A proxy pickles to (address, secret, object id, typeid), so it works in any process of ours.
As in the standard library, the server counts the proxies of each object and frees it when
the last is gone: creating an object (or a method returning one, ``method_to_typeid``)
gives its first reference, unpickling a proxy adds one, and a proxy garbage collected
releases its own. The release is queued and sent by a thread of its own (`_Releaser`),
never from the finalizer: a garbage collection may run it in the middle of another call.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing.util as std_util
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar

from fiberexec._serialize import dumps_as_stdlib, dumps_bytes, loads_as_stdlib
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._errors import ProcessError
from fiberexec.multiprocessing._rpc import Endpoint

if TYPE_CHECKING:  # the stdlib's managers (15 ms) load with the first token asked for
    from multiprocessing.managers import Token


class BaseProxy:
    """A reference to an object in a manager's server; picklable (to any of our processes)."""

    _exposed_: ClassVar[tuple[str, ...] | None] = None
    _method_to_typeid_: ClassVar[dict[str, str] | None] = None

    def __init__(self, address: str, secret: bytes, oid: int, typeid: str,
                 pool: ThreadPoolExecutor | None = None, *, incref: bool = False) -> None:
        endpoint = Endpoint(address, secret)
        object.__setattr__(self, "_fx", (endpoint, oid, typeid))
        object.__setattr__(self, "_fx_pool", pool)
        if incref:  # a copy (unpickled): its own reference, if the object still exists
            try:
                endpoint.call(calls.Incref(oid))
            except (ReferenceError, ConnectionError, OSError):
                return  # freed, or its manager stopped: calls say so; nothing to release
        _releaser.watch(self, address, secret, oid)

    def _callmethod(self, methodname: str, args: tuple[Any, ...] = (),
                    kwds: dict[str, Any] | None = None) -> Any:
        """Call ``methodname`` on the referent and return its result."""
        endpoint, oid, _ = self._fx
        made, body = endpoint.call(calls.CallMethod(oid, methodname),
                                   dumps_as_stdlib((args, kwds or {}), what="arguments"),
                                   timeout=None)
        if made is not None:  # method_to_typeid: a proxy for an object left in the server
            new_oid, typeid = made  # the server counted this proxy's reference
            proxytype = _proxy_types.get(typeid, BaseProxy)
            return proxytype(endpoint.address, endpoint.secret, new_oid, typeid, self._fx_pool)
        return loads_as_stdlib(body)

    @property
    def _token(self) -> Token:
        """The stdlib's description of the referent (``typeid``, ``address``, ``id``)."""
        endpoint, oid, typeid = self._fx
        from multiprocessing.managers import Token

        return Token(typeid, endpoint.address, oid)

    def _remote(self, kind: type[calls.GetAttr | calls.SetAttr | calls.DelAttr], name: str,
                body: bytes = b"") -> Any:
        endpoint, oid, _ = self._fx
        _, out = endpoint.call(kind(oid, name), body, timeout=None)
        return loads_as_stdlib(out) if out else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwds: self._callmethod(name, args, kwds)

    def __reduce__(self) -> tuple[Any, ...]:
        endpoint, oid, typeid = self._fx
        kind: Any = type(self)
        if getattr(kind, "_auto_", False):  # made here, not importable: made again there
            kind = (typeid, kind._exposed_)
        return (_rebuild_proxy, (kind, endpoint.address, endpoint.secret, oid, typeid))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object, typeid {self._fx[2]!r} at {id(self):#x}>"

    def __str__(self) -> str:
        return str(self._callmethod("__repr__"))


def public_methods(obj: object) -> tuple[str, ...]:
    """The methods of ``obj`` an `AutoProxy` exposes: its callable attributes not starting
    with ``_`` (as the stdlib's ``public_methods``)."""
    return tuple(name for name in dir(obj)
                 if not name.startswith("_") and callable(getattr(obj, name, None)))


_auto_proxies: dict[tuple[str, tuple[str, ...]], type[BaseProxy]] = {}


def auto_proxy(typeid: str, exposed: tuple[str, ...]) -> type[BaseProxy]:
    """The proxy type of a type registered without one, as the stdlib's ``AutoProxy``: named
    ``AutoProxy[typeid]``, with a method for each exposed one and no other attribute."""
    key = (typeid, tuple(exposed))
    kind = _auto_proxies.get(key)
    if kind is None:
        def method(name: str) -> Callable[..., Any]:
            def call(self: BaseProxy, /, *args: Any, **kwds: Any) -> Any:
                return self._callmethod(name, args, kwds)
            call.__name__ = name
            return call

        namespace: dict[str, Any] = {name: method(name) for name in exposed}
        namespace.update(_exposed_=key[1], _auto_=True, __getattr__=_no_attribute)
        kind = _auto_proxies[key] = type(f"AutoProxy[{typeid}]", (BaseProxy,), namespace)
    return kind


def _no_attribute(self: BaseProxy, name: str) -> Any:
    raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_proxy_types: dict[str, type[BaseProxy]] = {}  # typeid -> proxy type, for method_to_typeid


def _rebuild_proxy(cls: type[BaseProxy] | tuple[str, tuple[str, ...]], address: str,
                   secret: bytes, oid: int, typeid: str) -> BaseProxy:
    kind = auto_proxy(*cls) if isinstance(cls, tuple) else cls
    return kind(address, secret, oid, typeid, incref=True)




class _Releaser:
    """Sends the releases of garbage-collected handles (proxies, and `_sync`'s locks and
    events) to their servers, from a thread."""

    def __init__(self) -> None:
        self.pending: queue.SimpleQueue[tuple[str, bytes, int] | threading.Event] = (
            queue.SimpleQueue())
        self.sending = threading.Lock()  # one batch at a time (see `flush`)
        self.thread: threading.Thread | None = None
        self.start_lock = threading.Lock()
        self.live: dict[int, weakref.finalize[Any, Any]] = {}  # proxies not yet released
        self.keys = itertools.count()

    def watch(self, proxy: object, address: str, secret: bytes, oid: int) -> None:
        if self.thread is None:
            with self.start_lock:
                if self.thread is None:
                    # at exit, this process's proxies release their references, as the
                    # standard library's do: its exit function runs in our children too
                    # (`_process_main`). Registered by the process that makes proxies: a
                    # finalizer of another (a launcher that imported this) is skipped
                    std_util.Finalize(None, self.release_all, exitpriority=10)
                    self.thread = threading.Thread(target=self._run, daemon=True,
                                                   name="fiberexec-mp-proxy-release")
                    self.thread.start()
        key = next(self.keys)
        finalizer = weakref.finalize(proxy, self._release, key, (address, secret, oid))
        finalizer.atexit = False  # `release_all` runs them, then sends
        self.live[key] = finalizer

    def _release(self, key: int, ref: tuple[str, bytes, int]) -> None:
        # no call from here: this may run in a garbage collection, inside another call;
        # SimpleQueue.put is safe there
        self.live.pop(key, None)
        self.pending.put(ref)

    def release_all(self) -> None:
        """Release every proxy still alive here and send it all (at exit)."""
        for finalizer in list(self.live.values()):
            finalizer()
        self.flush()

    def _run(self) -> None:
        while True:
            first = self.pending.get()
            with self.sending:
                self._send([first])

    def flush(self) -> None:
        """Send every release queued so far, and wait until they are in: through the
        releaser's thread, after what it holds (its queue keeps the order), or here where
        it does not run (none started, or a forked child's copy)."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            with self.sending:
                self._send([])
            return
        done = threading.Event()
        self.pending.put(done)
        done.wait(_timing.TIMING.flush)

    def _send(self, batch: list[tuple[str, bytes, int] | threading.Event]) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                batch.append(self.pending.get_nowait())
        by_server: dict[tuple[str, bytes], list[int]] = {}
        for ref in batch:
            if not isinstance(ref, threading.Event):
                address, secret, oid = ref
                by_server.setdefault((address, secret), []).append(oid)
        for (address, secret), oids in by_server.items():
            with contextlib.suppress(ConnectionError, OSError):  # a stopped manager freed all
                Endpoint(address, secret).call(calls.Decref(tuple(oids)))
        for ref in batch:
            if isinstance(ref, threading.Event):  # a flush waits for what came before it
                ref.set()


_releaser = _Releaser()


class _Sequence(BaseProxy):
    def __len__(self) -> int:
        return int(self._callmethod("__len__"))

    def __getitem__(self, key: Any) -> Any:
        return self._callmethod("__getitem__", (key,))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._callmethod("__setitem__", (key, value))

    def __delitem__(self, key: Any) -> None:
        self._callmethod("__delitem__", (key,))

    def __contains__(self, item: Any) -> bool:
        return bool(self._callmethod("__contains__", (item,)))


class ListProxy(_Sequence):
    """A list in the manager; ``+``, ``*``, ``+=``, ``*=`` as the standard library's.

    Iterating reads item after item (``__getitem__``), as the standard library's does: an
    iterator sees the changes made while it runs."""

    def __add__(self, other: Any) -> Any:
        return self._callmethod("__add__", (other,))

    def __mul__(self, n: int) -> Any:
        return self._callmethod("__mul__", (n,))

    def __rmul__(self, n: int) -> Any:
        return self._callmethod("__rmul__", (n,))

    def __reversed__(self) -> Any:
        return self._callmethod("__reversed__")

    def __iadd__(self, other: Any) -> ListProxy:
        self._callmethod("extend", (other,))
        return self

    def __imul__(self, n: int) -> ListProxy:
        self._callmethod("__imul__", (n,))
        return self


class DictProxy(_Sequence):
    """A dict in the manager; its iterator lives there too (changing the dict's size while
    it runs raises RuntimeError, as a dict's own)."""

    _method_to_typeid_: ClassVar[dict[str, str] | None] = {"__iter__": "Iterator"}

    def __iter__(self) -> Any:
        return self._callmethod("__iter__")


class ArrayProxy(_Sequence):
    """An array in the manager, iterated item after item as the standard library's."""


class IteratorProxy(BaseProxy):
    """An iterator (or generator) left in the manager: each ``next`` asks it."""

    def __iter__(self) -> IteratorProxy:
        return self

    def __next__(self) -> Any:
        return self._callmethod("__next__")

    def send(self, value: Any) -> Any:
        return self._callmethod("send", (value,))

    def throw(self, *args: Any) -> Any:
        return self._callmethod("throw", args)

    def close(self) -> Any:
        return self._callmethod("close")


class EventProxy(BaseProxy):
    """A `threading.Event` in the manager."""

    def is_set(self) -> bool:
        return bool(self._callmethod("is_set"))

    def set(self) -> None:
        self._callmethod("set")

    def clear(self) -> None:
        self._callmethod("clear")

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._callmethod("wait", (timeout,)))


class PoolProxy(BaseProxy):
    """A `Pool` run by the manager's server: results of ``*_async`` and iterators of
    ``imap*`` stay there, behind proxies."""

    _exposed_: ClassVar[tuple[str, ...] | None] = (
        "apply", "apply_async", "close", "imap", "imap_unordered", "join", "map",
        "map_async", "starmap", "starmap_async", "terminate")
    _method_to_typeid_: ClassVar[dict[str, str] | None] = {
        "apply_async": "AsyncResult", "map_async": "AsyncResult",
        "starmap_async": "AsyncResult", "imap": "Iterator", "imap_unordered": "Iterator"}

    def __enter__(self) -> PoolProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()


class NamespaceProxy(BaseProxy):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._remote(calls.GetAttr, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._remote(calls.SetAttr, name, dumps_bytes(value, what="attribute"))

    def __delattr__(self, name: str) -> None:
        self._remote(calls.DelAttr, name)


class ValueProxy(BaseProxy):
    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> None:
        self._callmethod("set", (value,))

    value = property(get, set)


class AcquirerProxy(BaseProxy):
    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        args = (blocking,) if timeout is None else (blocking, timeout)
        return bool(self._callmethod("acquire", args))

    def release(self) -> None:
        self._callmethod("release")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ConditionProxy(AcquirerProxy):
    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._callmethod("wait", (timeout,)))

    def notify(self, n: int = 1) -> None:
        self._callmethod("notify", (n,))

    def notify_all(self) -> None:
        self._callmethod("notify_all")

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (evaluated here, with the lock held)."""
        return _timing.wait_until(predicate, self.wait, timeout)


class BarrierProxy(BaseProxy):
    def wait(self, timeout: float | None = None) -> int:
        return int(self._callmethod("wait", (timeout,)))

    parties = property(lambda self: self._remote(calls.GetAttr, "parties"))
    n_waiting = property(lambda self: self._remote(calls.GetAttr, "n_waiting"))
    broken = property(lambda self: self._remote(calls.GetAttr, "broken"))


class AsyncProxy(BaseProxy):
    """A proxy whose method calls return `concurrent.futures.Future`s."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        pool = self._fx_pool
        if pool is None:
            raise ProcessError("this AsyncProxy was unpickled elsewhere; its manager's "
                               "thread pool is not here. Call _callmethod() instead.")

        def submit(*args: Any, **kwds: Any) -> Future[Any]:
            future: Future[Any] = pool.submit(self._callmethod, name, args, kwds)
            return future

        return submit


