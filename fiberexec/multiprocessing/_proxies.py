"""Manager proxies: references to objects in a manager's server, with the stdlib's operators.

A proxy pickles to (address, secret, object id, typeid), so it works in any process of ours.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from fiberexec.multiprocessing._errors import ProcessError
from fiberexec.multiprocessing._rpc import Endpoint
from fiberexec.multiprocessing._wire import dumps, loads


class BaseProxy:
    """A reference to an object in a manager's server; picklable (to any of our processes)."""

    _exposed_: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, address: str, secret: bytes, oid: int, typeid: str,
                 pool: ThreadPoolExecutor | None = None) -> None:
        object.__setattr__(self, "_fx", (Endpoint(address, secret), oid, typeid))
        object.__setattr__(self, "_fx_pool", pool)

    def _callmethod(self, methodname: str, args: tuple[Any, ...] = (),
                    kwds: dict[str, Any] | None = None) -> Any:
        """Call ``methodname`` on the referent and return its result."""
        endpoint, oid, _ = self._fx
        made, body = endpoint.call("call", (oid, methodname), dumps((args, kwds or {})),
                                   timeout=None)
        if made is not None:  # method_to_typeid: a proxy for an object left in the server
            new_oid, typeid = made
            proxytype = _proxy_types.get(typeid, BaseProxy)
            return proxytype(endpoint.address, endpoint.secret, new_oid, typeid)
        return loads(body, what=f"result of {methodname}()")

    def _remote(self, op: str, name: str, body: bytes = b"") -> Any:
        endpoint, oid, _ = self._fx
        _, out = endpoint.call(op, (oid, name), body, timeout=None)
        return loads(out, what="attribute") if out else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwds: self._callmethod(name, args, kwds)

    def __reduce__(self) -> tuple[Any, ...]:
        endpoint, oid, typeid = self._fx
        return (_rebuild_proxy, (type(self), endpoint.address, endpoint.secret, oid, typeid))

    def __repr__(self) -> str:
        _, oid, typeid = self._fx
        return f"<{type(self).__name__} object, typeid {typeid!r} at {oid}>"

    def __str__(self) -> str:
        return str(self._callmethod("__repr__"))


_proxy_types: dict[str, type[BaseProxy]] = {}  # typeid -> proxy type, for method_to_typeid


def _rebuild_proxy(cls: type[BaseProxy], address: str, secret: bytes, oid: int,
                   typeid: str) -> BaseProxy:
    return cls(address, secret, oid, typeid)


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
    """A list in the manager; ``+``, ``*``, ``+=``, ``*=`` as the standard library's."""

    def __iter__(self) -> Any:
        return iter(self._callmethod("copy"))

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
    def __iter__(self) -> Any:
        return iter(self._callmethod("keys"))


class ArrayProxy(_Sequence):
    def __iter__(self) -> Any:
        return iter(self._callmethod("tolist"))


class NamespaceProxy(BaseProxy):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._remote("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._remote("setattr", name, dumps(value, what="attribute"))

    def __delattr__(self, name: str) -> None:
        self._remote("delattr", name)


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
        import time

        result = predicate()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not result:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result


class BarrierProxy(BaseProxy):
    def wait(self, timeout: float | None = None) -> int:
        return int(self._callmethod("wait", (timeout,)))

    parties = property(lambda self: self._remote("getattr", "parties"))
    n_waiting = property(lambda self: self._remote("getattr", "n_waiting"))
    broken = property(lambda self: self._remote("getattr", "broken"))


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


