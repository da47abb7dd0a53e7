"""`SyncManager` and `AsyncManager`: shared objects held by a job-backed server process.

    manager.start() -> Process(target=_serve) on the backend -> it binds an `RpcServer`,
                       sends its address back through a broker `SimpleQueue`
    manager.list()  -> "create" -> object id -> a proxy holding (address, secret, id)
    proxy.append(x) -> "call" (id, "append") with pickled args -> the server's thread runs it

Each request runs on its own server thread, so blocking calls (a lock, an event, a queue)
wait there. Locks that have an owner (RLock, Condition) are owned by the calling client
thread, not by the server thread that happens to serve it. `AsyncManager`'s proxies return
`concurrent.futures.Future`s, so calls on many objects run at once; with ``servers=N`` the
objects are spread over N server processes, so CPU-bound objects run in parallel too.
"""

from __future__ import annotations

import array
import itertools
import queue
import socket
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from fiberexec.multiprocessing import _backends
from fiberexec.multiprocessing._errors import ProcessError
from fiberexec.multiprocessing._process import Process
from fiberexec.multiprocessing._queues import SimpleQueue
from fiberexec.multiprocessing._rpc import Caller, Endpoint, RpcServer
from fiberexec.multiprocessing._wire import dumps, loads

START_TIMEOUT = 120.0
_caller = threading.local()

# ---------------------------------------------------------------------------- server side


class _OwnedLock:
    """A lock owned by the calling client thread; reentrant for RLock."""

    def __init__(self, reentrant: bool = True) -> None:
        self._cond = threading.Condition()
        self._owner: Caller | None = None
        self._count = 0
        self._reentrant = reentrant

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = _caller.value
        with self._cond:
            if self._reentrant and self._owner == me:
                self._count += 1
                return True
            wait = None if timeout is None or timeout < 0 else timeout
            if not blocking:
                wait = 0
            if not self._cond.wait_for(lambda: self._owner is None, timeout=wait):
                return False
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner is None or (self._reentrant and self._owner != _caller.value):
                raise RuntimeError("cannot release un-acquired lock")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify()

    def _release_all(self) -> int:
        with self._cond:
            if self._owner != _caller.value:
                raise RuntimeError("cannot wait on un-acquired lock")
            count, self._owner, self._count = self._count, None, 0
            self._cond.notify()
            return count

    def _restore(self, count: int) -> None:
        self.acquire()
        with self._cond:
            self._count = count

    def __repr__(self) -> str:
        return f"<RLock owner={self._owner} count={self._count}>"


class _OwnedCondition:
    def __init__(self, lock: _OwnedLock | None = None) -> None:
        self._lock = lock or _OwnedLock()
        self._waiters: deque[threading.Event] = deque()
        self._guard = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        waiter = threading.Event()
        with self._guard:
            self._waiters.append(waiter)
        saved = self._lock._release_all()
        try:
            notified = waiter.wait(timeout)
        finally:
            with self._guard:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            self._lock._restore(saved)
        return notified

    def notify(self, n: int = 1) -> None:
        with self._guard:
            for _ in range(min(n, len(self._waiters))):
                self._waiters.popleft().set()

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class Namespace:
    def __init__(self, **kwds: Any) -> None:
        self.__dict__.update(kwds)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()))
        return f"Namespace({items})"


class _Value:
    def __init__(self, typecode: str, value: Any, lock: bool = True) -> None:
        self._typecode, self._value = typecode, value

    def get(self) -> Any:
        return self._value

    def set(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._typecode!r}, {self._value!r})"


def _array(typecode: str, sequence: Any, lock: bool = True) -> array.array[Any]:
    return array.array(typecode, sequence)


class _Server:
    def __init__(self, registry: dict[str, Callable[..., Any]]) -> None:
        self.registry = registry
        self.objects: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.stop = threading.Event()

    def handle(self, op: str, args: tuple[Any, ...], body: bytes, caller: Caller) -> tuple[
            Any, bytes]:
        _caller.value = caller
        if op == "create":
            (typeid,) = args
            cargs, ckwds = loads(body, what="constructor arguments")
            oid = next(self.ids)
            self.objects[oid] = self.registry[typeid](*cargs, **ckwds)
            return oid, b""
        if op == "call":
            oid, name = args
            cargs, ckwds = loads(body, what="method arguments")
            result = getattr(self.objects[oid], name)(*cargs, **ckwds)
            if isinstance(result, type({}.keys()) | type({}.values()) | type({}.items())):
                result = list(result)
            return None, dumps(result, what=f"result of {name}()")
        if op == "getattr":
            return None, dumps(getattr(self.objects[args[0]], args[1]), what="attribute")
        if op == "setattr":
            setattr(self.objects[args[0]], args[1], loads(body, what="attribute"))
            return None, b""
        if op == "delattr":
            delattr(self.objects[args[0]], args[1])
            return None, b""
        if op == "shutdown":
            self.stop.set()
            return None, b""
        raise ValueError(f"unknown manager operation {op!r}")


def _serve(registry: dict[str, Callable[..., Any]], secret: bytes, reply: SimpleQueue,
           loopback: bool) -> None:
    """The manager process: serve objects until told to shut down (or the parent goes)."""
    server = _Server(registry)
    host = "127.0.0.1" if loopback else "0.0.0.0"
    rpc = RpcServer(secret, server.handle, host)
    advertise = host if loopback else socket.gethostbyname(socket.gethostname())
    reply.put(rpc.advertised(advertise))
    server.stop.wait()
    rpc.close()

# ---------------------------------------------------------------------------- client side


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
        _, body = endpoint.call("call", (oid, methodname), dumps((args, kwds or {})),
                                timeout=None)
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
    def __iter__(self) -> Any:
        return iter(self._callmethod("copy"))

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


# ---------------------------------------------------------------------------- managers

Registry = dict[str, tuple[Callable[..., Any], type[BaseProxy]]]


class SyncManager:
    """Start a job-backed server holding shared objects; hand out proxies to them.

    Args:
        address, authkey: accepted for compatibility; a fresh address and secret are made.
        backend: where the server runs (default: the default backend).
        servers: how many server processes share the objects (round robin).

    Example:
        >>> with Manager() as m:  # doctest: +SKIP
        ...     shared = m.dict()
    """

    _registry: ClassVar[Registry] = {}
    _proxy_base: ClassVar[type[BaseProxy]] = BaseProxy

    def __init__(self, address: object = None, authkey: bytes | None = None, *,
                 backend: _backends.BackendLike | None = None, servers: int = 1,
                 start_timeout: float = START_TIMEOUT) -> None:
        if not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers must be an int >= 1, got {servers!r}")
        self._backend = backend
        self._servers, self._start_timeout = servers, start_timeout
        self._procs: list[Process] = []
        self._addresses: list[str] = []
        self._secret = b""
        self._next = itertools.count()
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def register(  # noqa: PLR0917  # the standard library's signature
        cls, typeid: str, callable: Callable[..., Any] | None = None,
                 proxytype: type[BaseProxy] | None = None, exposed: object = None,
                 method_to_typeid: object = None, create_method: bool = True) -> None:
        """Make ``manager.<typeid>(*args)`` create ``callable(*args)`` in the server."""
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)
        if callable is None:
            raise TypeError(f"register({typeid!r}) needs a callable that makes the object")
        cls._registry[typeid] = (callable, proxytype or cls._proxy_base)
        if create_method:
            def create(self: SyncManager, *args: Any, **kwds: Any) -> BaseProxy:
                return self._create(typeid, *args, **kwds)

            create.__name__ = typeid
            setattr(cls, typeid, create)

    def start(self, initializer: Callable[..., object] | None = None,
              initargs: tuple[Any, ...] = ()) -> None:
        """Start the server process(es) and wait until they listen."""
        if self._procs:
            raise ProcessError("Already started server")
        from fiberexec import _auth

        self._secret = _auth.new_secret()
        backend = _backends.new_backend(self._backend) if self._backend else (
            _backends.shared_backend())
        loopback = backend.bind_host.startswith("127.") or backend.bind_host == "localhost"
        registry = {name: fn for name, (fn, _) in self._registry.items()}
        reply = SimpleQueue()
        for i in range(self._servers):
            proc = Process(target=_serve, args=(registry, self._secret, reply, loopback),
                           name=f"{type(self).__name__}-server-{i}", daemon=True,
                           backend=self._backend)
            proc.start()
            self._procs.append(proc)
        for _ in range(self._servers):
            try:
                self._addresses.append(reply.get(timeout=self._start_timeout))
            except queue.Empty:
                self.shutdown()
                raise ProcessError(
                    f"the manager server did not start within {self._start_timeout}s; "
                    f"its exit code: {[p.exitcode for p in self._procs]}") from None
        if initializer is not None:
            initializer(*initargs)

    def _create(self, typeid: str, *args: Any, **kwds: Any) -> BaseProxy:
        if not self._addresses:
            raise ProcessError("the manager is not started; call start() or use `with`")
        address = self._addresses[next(self._next) % len(self._addresses)]
        endpoint = Endpoint(address, self._secret)
        oid, _ = endpoint.call("create", (typeid,), dumps((args, kwds), what="arguments"))
        proxytype = self._registry[typeid][1]
        return proxytype(address, self._secret, oid, typeid, self._pool)

    def shutdown(self) -> None:
        """Stop the server processes (their objects are gone after this)."""
        for address in self._addresses:
            try:
                Endpoint(address, self._secret).call("shutdown", (), timeout=5.0)
            except (ConnectionError, OSError):
                pass  # it closed before answering: that is the point
        for proc in self._procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        self._procs.clear()
        self._addresses.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def connect(self) -> None:
        raise NotImplementedError("connecting to a running manager by address is not "
                                  "supported; pass its proxies to processes instead")

    def __enter__(self) -> SyncManager:
        if not self._procs:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


_TYPES: list[tuple[str, Callable[..., Any], type[BaseProxy]]] = [
    ("Queue", queue.Queue, BaseProxy),
    ("JoinableQueue", queue.Queue, BaseProxy),
    ("Event", threading.Event, BaseProxy),
    ("Lock", threading.Lock, AcquirerProxy),
    ("RLock", _OwnedLock, AcquirerProxy),
    ("Semaphore", threading.Semaphore, AcquirerProxy),
    ("BoundedSemaphore", threading.BoundedSemaphore, AcquirerProxy),
    ("Condition", _OwnedCondition, ConditionProxy),
    ("Barrier", threading.Barrier, BarrierProxy),
    ("list", list, ListProxy),
    ("dict", dict, DictProxy),
    ("Namespace", Namespace, NamespaceProxy),
    ("Value", _Value, ValueProxy),
    ("Array", _array, ArrayProxy),
]
for _typeid, _callable, _proxy in _TYPES:
    SyncManager.register(_typeid, _callable, _proxy)


class AsyncManager(SyncManager):
    """A manager whose proxies' method calls return `Future`s (`AsyncProxy`).

    Register your own types (``AsyncManager.register("Env", MyEnv)``), create N of them and
    step them at once: ``wait([env.step(a) for env in envs])``.

    Args:
        max_concurrency: calls in flight at once from this process.
    """

    _registry: ClassVar[Registry] = {}
    _proxy_base: ClassVar[type[BaseProxy]] = AsyncProxy

    def __init__(self, *args: Any, max_concurrency: int = 64, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_concurrency = max_concurrency

    def start(self, initializer: Callable[..., object] | None = None,
              initargs: tuple[Any, ...] = ()) -> None:
        self._pool = ThreadPoolExecutor(self._max_concurrency,
                                        thread_name_prefix="fiberexec-async-manager")
        super().start(initializer, initargs)

    def __enter__(self) -> AsyncManager:
        super().__enter__()
        return self


for _typeid, _callable, _proxy in _TYPES:
    AsyncManager.register(_typeid, _callable, AsyncProxy)


def Manager(*, backend: _backends.BackendLike | None = None) -> SyncManager:
    """A started `SyncManager` (`multiprocessing.Manager`)."""
    manager = SyncManager(backend=backend)
    manager.start()
    return manager
