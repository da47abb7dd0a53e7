"""`BaseManager`, `SyncManager` and `AsyncManager`: shared objects held by a job-backed server.

    manager.start() -> Process(target=_serve) on the backend -> it binds an `RpcServer`,
                       sends its address back through a broker `SimpleQueue`
    manager.list()  -> "create" -> object id -> a proxy holding (address, secret, id)
    proxy.append(x) -> "call" (id, "append") with pickled args -> the server's thread runs it

Each request runs on its own server thread, so blocking calls (a lock, an event, a queue)
wait there. As in the standard library, the server is shut down by `shutdown`, by leaving a
``with`` block, when the manager object is garbage collected, or at program exit (a
finalizer), so a dropped manager leaves no process behind. Locks that have an owner
(RLock, Condition) are owned by the calling client thread, not by the server thread that
happens to serve it. `AsyncManager`'s proxies return `concurrent.futures.Future`s, so calls
on many objects run at once; with ``servers=N`` the objects are spread over N server
processes, so CPU-bound objects run in parallel too.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import queue
import signal
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import wait as connection_wait
from typing import Any, ClassVar

from fiberexec._serialize import dumps_as_stdlib, dumps_bytes, loads_bytes
from fiberexec.multiprocessing import _backends, _sync_server, _timing
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing._errors import ProcessError
from fiberexec.multiprocessing._pool import Pool
from fiberexec.multiprocessing._process import Process
from fiberexec.multiprocessing._proxies import (
    AcquirerProxy,
    ArrayProxy,
    AsyncProxy,
    BarrierProxy,
    BaseProxy,
    ConditionProxy,
    DictProxy,
    EventProxy,
    IteratorProxy,
    ListProxy,
    NamespaceProxy,
    PoolProxy,
    ValueProxy,
    _proxy_types,
    _releaser,
    auto_proxy,
    public_methods,
)
from fiberexec.multiprocessing._queues import SimpleQueue
from fiberexec.multiprocessing._remote_error import RemoteError
from fiberexec.multiprocessing._rpc import Caller, Endpoint, RpcServer

# ---------------------------------------------------------------------------- server side


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


@dataclass(frozen=True)
class TypeInfo:
    """What the server needs to know about a registered type."""

    make: Callable[..., Any] | None
    exposed: tuple[str, ...] | None = None
    method_to_typeid: dict[str, str] | None = None


# A dict's keys(), values() and items() views: sent as lists, as the stdlib's manager does.
_DICT_VIEWS: tuple[type[Iterable[Any]], ...] = (
    type({}.keys()), type({}.values()), type({}.items()))


class _Server:
    def __init__(self, registry: dict[str, TypeInfo]) -> None:
        self.registry = registry
        self.objects = _sync_server.ObjectTable("manager", "proxy")
        self.stop = threading.Event()

    def _call(self, oid: int, name: str, body: bytes, holder: str) -> tuple[Any, bytes]:
        obj, typeid = self.objects.get(oid)
        info = self.registry[typeid]
        if info.exposed is not None and name not in info.exposed:
            raise AttributeError(f"method {name!r} of {type(obj)!r} object is not in "
                                 f"exposed={info.exposed!r}")
        cargs, ckwds = loads_bytes(body, what="method arguments")
        result = getattr(obj, name)(*cargs, **ckwds)
        new_typeid = (info.method_to_typeid or {}).get(name)
        if new_typeid is not None:  # the result stays here; the caller gets a proxy
            make = self.registry[new_typeid].make  # as the stdlib: make(result), if any
            kept = result if make is None else make(result)
            return (self.objects.add(kept, new_typeid, holder), new_typeid), b""
        if isinstance(result, _DICT_VIEWS):
            result = list(result)
        return None, dumps_bytes(result, what=f"result of {name}()")

    def handle(self, call: calls.Call, body: bytes, caller: Caller) -> tuple[Any, bytes]:
        """Serve one call (`_rpc`): its result and the answer's body."""
        _sync_server.caller.value = caller
        objects = self.objects
        result: Any = None
        match call:
            case calls.CallMethod(oid, name):
                return self._call(oid, name, body, caller[0])
            case calls.Create(typeid):
                result = self._create(typeid, body, caller[0])
            case calls.GetAttr(oid, name):
                return None, dumps_bytes(getattr(objects.get(oid)[0], name), what="attribute")
            case calls.SetAttr(oid, name):
                setattr(objects.get(oid)[0], name, loads_bytes(body, what="attribute"))
            case calls.DelAttr(oid, name):
                delattr(objects.get(oid)[0], name)
            case calls.Incref(oid):
                objects.incref(oid, caller[0])
            case calls.Decref(oids):
                objects.decref(oids, caller[0])
            case calls.Count():
                result = len(objects)
            case calls.DebugInfo():
                result = objects.debug_info()
            case calls.Shutdown():
                self.stop.set()
            case _:
                raise ValueError(f"a manager's server does not serve {call!r}")
        return result, b""

    def _create(self, typeid: str, body: bytes, holder: str) -> tuple[int, tuple[str, ...]]:
        """The new object's id, and the methods its proxies may call (as the stdlib's
        server answers, for an `AutoProxy`)."""
        cargs, ckwds = loads_bytes(body, what="constructor arguments")
        info = self.registry[typeid]
        if info.make is None:
            raise ValueError(f"type {typeid!r} has no callable; it cannot be created")
        obj = info.make(*cargs, **ckwds)
        exposed = info.exposed if info.exposed is not None else public_methods(obj)
        return self.objects.add(obj, typeid, holder), exposed


def _serve(registry: dict[str, TypeInfo], secret: bytes, reply: SimpleQueue) -> None:
    """The manager process: serve objects until told to shut down (or the parent goes).
    A Ctrl-C at the terminal reaches the whole process group: as the stdlib's server, this
    one ignores it, so the parent's ``except KeyboardInterrupt`` can still read and save
    the shared state (bpo-36368)."""
    with contextlib.suppress(ValueError):  # (not the main thread: no signals here anyway)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = _Server(registry)
    host, advertise = _backends.broker_hosts()  # reachable from the manager's parent
    # a client that is gone (killed) releases its proxies, as at its normal exit
    rpc = RpcServer(secret, server.handle, host, holders=server.objects)
    reply.put(rpc.advertised(advertise))
    server.stop.wait()
    rpc.close()

# ---------------------------------------------------------------------------- managers


Registry = dict[str, tuple[TypeInfo, type[BaseProxy]]]


class _Servers:
    """What a manager's finalizer needs (never the manager itself)."""

    def __init__(self) -> None:
        self.procs: list[Process] = []
        self.addresses: list[str] = []
        self.pool: ThreadPoolExecutor | None = None
        self.owned = True  # False after connect(): someone else's server


def _shutdown(servers: _Servers, secret: bytes) -> None:
    """Tell each server to stop, wait for its process (kill it if it does not), forget it."""
    if servers.owned:
        for address in servers.addresses:
            try:
                Endpoint(address, secret).call(calls.Shutdown(),
                                               timeout=_timing.TIMING.manager_shutdown)
            except (ConnectionError, OSError):
                pass  # it closed before answering: that is the point
    for proc in servers.procs:
        proc.join(_timing.TIMING.manager_shutdown)
        if proc.is_alive():
            proc.kill()
            proc.join(_timing.TIMING.manager_shutdown)
    servers.procs.clear()
    servers.addresses.clear()
    if servers.pool is not None:
        servers.pool.shutdown(wait=False, cancel_futures=True)


class BaseManager:
    """A job-backed server holding shared objects, handing out proxies to them.

    Args:
        address: a running manager's `address`, for `connect` (else a fresh one is made).
        authkey: the key clients prove they hold (default: `current_process().authkey`,
            as in the standard library, so children of this program can connect).
        backend: where the server runs (default: the default backend).
        servers: how many server processes share the objects (round robin).

    The server stops on `shutdown`, at the end of a ``with`` block, when the manager is
    garbage collected, or at program exit.

    Example:
        >>> with SyncManager() as m:  # doctest: +SKIP
        ...     shared = m.dict()
    """

    _registry: ClassVar[Registry] = {}
    _proxy_base: ClassVar[type[BaseProxy]] = BaseProxy

    def __init__(self, address: str | None = None, authkey: bytes | None = None, *,
                 backend: _backends.BackendLike | None = None, servers: int = 1,
                 start_timeout: float | None = None) -> None:
        if not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers must be an int >= 1, got {servers!r}")
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a manager's .address string, got {address!r}")
        from fiberexec.multiprocessing._process import current_process

        self._address = address
        self._secret = bytes(authkey) if authkey is not None else current_process().authkey
        self._backend = backend
        self._servers_wanted = servers
        self._start_timeout = (_timing.TIMING.manager_start if start_timeout is None
                               else start_timeout)
        self._servers = _Servers()
        self._next = itertools.count()
        self._finalizer: weakref.finalize | None = None  # type: ignore[type-arg]

    @classmethod
    def register(  # noqa: PLR0917  # the standard library's signature
        cls, typeid: str, callable: Callable[..., Any] | None = None,
                 proxytype: type[BaseProxy] | None = None, exposed: Sequence[str] | None = None,
                 method_to_typeid: dict[str, str] | None = None,
                 create_method: bool = True) -> None:
        """Make ``manager.<typeid>(*args)`` create ``callable(*args)`` in the server.

        ``exposed`` limits the methods proxies may call; ``method_to_typeid`` names methods
        whose results stay in the server and come back as proxies of that typeid.
        """
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)
        proxytype = proxytype or cls._proxy_base
        exposed = exposed or getattr(proxytype, "_exposed_", None)
        method_to_typeid = method_to_typeid or getattr(proxytype, "_method_to_typeid_", None)
        info = TypeInfo(callable, tuple(exposed) if exposed is not None else None,
                        dict(method_to_typeid) if method_to_typeid else None)
        cls._registry[typeid] = (info, proxytype)
        _proxy_types.setdefault(typeid, proxytype)
        if create_method:
            def create(self: BaseManager, /, *args: Any, **kwds: Any) -> BaseProxy:
                return self._create(typeid, *args, **kwds)

            create.__name__ = typeid
            setattr(cls, typeid, create)

    @property
    def address(self) -> str | None:
        """The first server's address (pass it with the authkey to connect elsewhere)."""
        return self._servers.addresses[0] if self._servers.addresses else self._address

    def start(self, initializer: Callable[..., object] | None = None,
              initargs: tuple[Any, ...] = ()) -> None:
        """Start the server process(es) and wait until they listen."""
        self._check_not_shut_down()
        if self._servers.procs or self._servers.addresses:
            raise ProcessError("Already started server")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._begin()
        registry = {name: info for name, (info, _) in self._registry.items()}
        reply = SimpleQueue()
        for i in range(self._servers_wanted):
            proc = Process(target=_serve, args=(registry, self._secret, reply),
                           name=f"{type(self).__name__}-server-{i}", daemon=True,
                           backend=self._backend)
            proc.start()
            self._servers.procs.append(proc)
        self._await_addresses(reply)
        if initializer is not None:
            initializer(*initargs)

    def _begin(self) -> None:
        self._servers = _Servers()
        self._finalizer = weakref.finalize(self, _shutdown, self._servers, self._secret)

    def _await_addresses(self, reply: SimpleQueue) -> None:
        """Wait for each server's address, or for a server to die starting, or the deadline."""
        deadline = _timing.Deadline(self._start_timeout)
        reader = reply._reader  # readable while an address waits (the queue is ours)
        try:
            while len(self._servers.addresses) < self._servers_wanted:
                left = deadline.left()
                waitables = [reader, *(p.sentinel for p in self._servers.procs)]
                if left and reader in connection_wait(waitables, timeout=left):
                    self._servers.addresses.append(reply.get())
                    continue
                codes = [p.exitcode for p in self._servers.procs]
                if any(code is not None for code in codes) or deadline.passed():
                    self.shutdown()
                    raise ProcessError(
                        f"the manager server did not start within {self._start_timeout}s "
                        f"(exit codes {codes}); its output says why: a class registered with "
                        "the manager must be importable where the server runs") from None
        finally:
            reader.close()

    def connect(self) -> None:
        """Use the running manager at ``address`` (given to the constructor) with ``authkey``."""
        if self._address is None:
            raise ValueError("connect() needs address=, the .address of a running manager")
        self._begin()
        self._servers.owned = False
        self._servers.addresses.append(self._address)

    def _create(self, typeid: str, /, *args: Any, **kwds: Any) -> BaseProxy:
        addresses = self._servers.addresses
        if not addresses:
            raise ProcessError("the manager is not started; call start() or use `with`")
        address = addresses[next(self._next) % len(addresses)]
        endpoint = Endpoint(address, self._secret)
        body = dumps_as_stdlib((args, kwds), what="arguments")
        try:
            (oid, exposed), _ = endpoint.call(calls.Create(typeid), body)
        except (ConnectionError, ReferenceError):
            raise
        except Exception as exc:  # as the standard library's managers report it
            raise RemoteError(f"making the manager's {typeid!r} raised "
                              f"{type(exc).__name__}: {exc}") from exc
        proxytype = self._registry[typeid][1]
        if proxytype is BaseProxy:  # registered with no proxy type: the stdlib's AutoProxy
            proxytype = auto_proxy(typeid, exposed)
        return proxytype(address, self._secret, oid, typeid, self._servers.pool)

    def shutdown(self) -> None:
        """Stop the server processes (their objects are gone after this)."""
        if self._finalizer is not None:
            self._finalizer()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the server processes exit (after `shutdown`, or if they die)."""
        for proc in list(self._servers.procs):
            proc.join(timeout)

    def _ask_servers(self, call: calls.Call) -> list[Any]:
        _releaser.flush()  # this process's dropped proxies first
        return [Endpoint(address, self._secret).call(call)[0]
                for address in self._servers.addresses]

    def _number_of_objects(self) -> int:
        """How many shared objects the servers hold (the standard library's debug aid)."""
        return int(sum(self._ask_servers(calls.Count())))

    def _debug_info(self) -> str:
        """Each shared object the servers hold, with its count of proxies."""
        return "".join(self._ask_servers(calls.DebugInfo()))

    def __enter__(self) -> BaseManager:
        self._check_not_shut_down()
        if not self._servers.addresses:
            self.start()
        return self

    def _check_not_shut_down(self) -> None:
        """A manager shut down is not started again (the stdlib's words)."""
        if self._finalizer is not None and not self._finalizer.alive:
            raise ProcessError("Manager has shut down")

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class SyncManager(BaseManager):
    """A manager with the standard library's types: ``dict``, ``list``, ``Lock``, ``Queue``..."""


_TYPES: list[tuple[str, Callable[..., Any], type[BaseProxy]]] = [
    ("Queue", queue.Queue, BaseProxy),
    ("JoinableQueue", queue.Queue, BaseProxy),
    ("Event", threading.Event, EventProxy),
    ("Lock", threading.Lock, AcquirerProxy),
    ("RLock", _sync_server.ThreadRLock, AcquirerProxy),
    ("Semaphore", threading.Semaphore, AcquirerProxy),
    ("BoundedSemaphore", threading.BoundedSemaphore, AcquirerProxy),
    ("Condition", _sync_server.ThreadCondition, ConditionProxy),
    ("Barrier", threading.Barrier, BarrierProxy),
    ("list", list, ListProxy),
    ("dict", dict, DictProxy),
    ("Namespace", Namespace, NamespaceProxy),
    ("Value", _Value, ValueProxy),
    ("Array", _array, ArrayProxy),
    ("Pool", Pool, PoolProxy),
]
for _typeid, _callable, _proxy in _TYPES:
    SyncManager.register(_typeid, _callable, _proxy)
SyncManager.register("Iterator", proxytype=IteratorProxy, create_method=False)
SyncManager.register("AsyncResult", create_method=False)


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

    def _begin(self) -> None:
        super()._begin()
        self._servers.pool = ThreadPoolExecutor(self._max_concurrency,
                                                thread_name_prefix="fiberexec-async-manager")

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
