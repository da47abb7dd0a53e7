"""`Lock`, `RLock`, `Semaphore`, `BoundedSemaphore`, `Condition`, `Event`, `Barrier`.

    Lock()           -> the creating process's broker holds a `_sync_server` object
    lock.acquire()   -> `_calls.CallObject(id, "acquire")` to that broker: a direct call in the
                        creating process, an authenticated round trip from anywhere else
    pickle(lock)     -> (broker address, secret, id): works in a Process, a Pool task or a
                        manager call, on every backend, because every process can reach
                        the broker that started it
    del lock         -> the broker frees the object once no copy of the handle is left in
                        any process (`_sync_server.ObjectTable`), as a manager frees the
                        referent of its last proxy

Blocking calls that may be retried (acquire, Event.wait) wait in the broker in slices of at
most `Timing.slice` seconds, so a client that vanishes holds a server thread for one slice.
`Condition.wait` and `Barrier.wait` cannot be split without changing their meaning, so they
wait in one call for the whole timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fiberexec._serialize import dumps_bytes
from fiberexec.multiprocessing import _broker as b
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing._links import TIMING
from fiberexec.multiprocessing._proxies import _releaser
from fiberexec.multiprocessing._rpc import Endpoint

BrokenBarrierError = threading.BrokenBarrierError
T = TypeVar("T")


class _Shared:
    """A handle on an object held by a broker; pickles to (address, secret, id)."""

    _kind = ""

    def __init__(self, *args: Any, ctx: object = None, _lock_id: int | None = None,
                 _action: bytes = b"") -> None:
        broker = b.get_broker()
        self._endpoint: Endpoint = broker.endpoint
        self._oid: int = self._endpoint.call(
            calls.NewObject(self._kind, args, _lock_id), _action)[0]
        _releaser.watch(self, self._endpoint.address, self._endpoint.secret, self._oid)

    def __reduce__(self) -> tuple[Any, ...]:
        ep = self._endpoint
        return (_rebuild, (type(self), ep.address, ep.secret, self._oid))

    def _call(self, name: str, *args: Any, wait: float | None = 0.0) -> Any:
        timeout = None if wait is None else wait + TIMING.call
        return self._endpoint.call(calls.CallObject(self._oid, name, args), timeout=timeout)[0]

    def _get(self, name: str) -> Any:
        return self._endpoint.call(calls.ObjectAttr(self._oid, name))[0]

    def _blocking(self, name: str, block: bool, timeout: float | None) -> bool:
        if not block:
            return bool(self._call(name, False))
        return b.wait_slices(timeout, lambda w: bool(self._call(name, True, w, wait=w)))


def _rebuild(cls: type[_Shared], address: str, secret: bytes, oid: int) -> _Shared:
    """A copy in another process (or this one), with a reference of its own: the broker
    keeps the object while any copy lives (see `_sync_server.ObjectTable`)."""
    obj = cls.__new__(cls)
    obj._endpoint, obj._oid = Endpoint(address, secret), oid
    try:
        obj._endpoint.call(calls.Incref(oid))
    except (ReferenceError, ConnectionError, OSError):
        return obj  # freed, or its process ended: calls say so; nothing to release
    _releaser.watch(obj, address, secret, oid)
    return obj


class _Acquirer(_Shared):
    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire; with ``block=False`` or a ``timeout``, False if it could not."""
        return self._blocking("acquire", block, timeout)

    def release(self) -> None:
        self._call("release")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _owner_name(self, owner: Any) -> str:
        return "None" if owner is None else "SomeOtherProcess"


class _SemLockView:
    """``_semlock``: what the standard library's own code reads of a lock or semaphore it
    was given, answered by the broker that holds it. The stdlib's `queues.Queue` made with
    this module's context (as `concurrent.futures.ProcessPoolExecutor` makes its call
    queue) asks ``_is_zero()`` in ``full()`` and ``_get_value()`` in ``qsize()``."""

    def __init__(self, owner: _Acquirer) -> None:
        self._owner = owner

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._owner.acquire(block, timeout)

    def release(self) -> None:
        self._owner.release()

    def _get_value(self) -> int:
        return int(self._owner._call("_semlock_value"))

    def _is_zero(self) -> bool:
        return self._get_value() == 0

    def _is_mine(self) -> bool:
        """Whether the calling thread holds it."""
        return bool(self._owner._call("_is_mine"))

    def _count(self) -> int:
        """How many times the calling thread holds it."""
        return int(self._owner._call("_semlock_count"))


class _SemLock(_Acquirer):
    @property
    def _semlock(self) -> _SemLockView:
        return _SemLockView(self)


class Semaphore(_SemLock):
    """A counter shared by processes (`multiprocessing.Semaphore`)."""

    _kind = "Semaphore"

    def __init__(self, value: int = 1, *, ctx: object = None) -> None:
        super().__init__(value)

    def get_value(self) -> int:
        return int(self._call("get_value"))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(value={self._get('_describe')[0]})>"


class BoundedSemaphore(Semaphore):
    """A `Semaphore` whose ``release`` past its initial value raises ValueError."""

    _kind = "BoundedSemaphore"


class Lock(_SemLock):
    """A non-recursive lock shared by processes (`multiprocessing.Lock`).

    Any process may release it; releasing it when unlocked raises ValueError.
    """

    _kind = "Lock"

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__()

    def __repr__(self) -> str:
        value, owner = self._get("_describe")
        return f"<Lock(owner={self._owner_name(owner) if value == 0 else None})>"


class RLock(_SemLock):
    """A recursive lock owned by the thread (in whichever process) that acquired it."""

    _kind = "RLock"

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__()

    def __repr__(self) -> str:
        count, owner = self._get("_describe")
        return f"<RLock({self._owner_name(owner)}, {count})>"


class Condition(_Acquirer):
    """A condition variable shared by processes (`multiprocessing.Condition`).

    Args:
        lock: a `Lock` or `RLock` of this module to use (default: a new `RLock`).
    """

    _kind = "Condition"

    def __init__(self, lock: Lock | RLock | None = None, *, ctx: object = None) -> None:
        if lock is None:
            super().__init__()
            return
        if not isinstance(lock, Lock | RLock):
            raise TypeError(f"lock must be a Lock or RLock of this module, got {lock!r}")
        self._endpoint, self._oid = lock._endpoint, 0  # held by the lock's broker
        self._oid = self._endpoint.call(calls.NewObject(self._kind, (), lock._oid))[0]

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify or ``timeout``, re-acquire; True if notified."""
        return bool(self._call("wait", timeout, wait=timeout))

    def wait_for(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """Wait until ``predicate()`` is true (it is evaluated here, holding the lock)."""
        result = predicate()
        endtime = None if timeout is None else time.monotonic() + timeout
        waittime = None
        while not result:
            if endtime is not None:
                waittime = endtime - time.monotonic()
                if waittime <= 0:
                    break
            self.wait(waittime)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        self._call("notify", n)

    def notify_all(self) -> None:
        self._call("notify_all")

    def __repr__(self) -> str:
        return f"<Condition id={self._oid}>"


class Event(_Shared):
    """A flag processes can set, clear and wait for (`multiprocessing.Event`)."""

    _kind = "Event"

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__()

    def is_set(self) -> bool:
        return bool(self._call("is_set"))

    def set(self) -> None:
        self._call("set")

    def clear(self) -> None:
        self._call("clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set or ``timeout`` passes; return the flag."""
        return b.wait_slices(timeout, lambda w: bool(self._call("wait", w, wait=w)))

    def __repr__(self) -> str:
        state = "set" if self.is_set() else "unset"
        return f"<{type(self).__qualname__} at {id(self):#x} {state}>"


class Barrier(_Shared):
    """A barrier for ``parties`` processes (`multiprocessing.Barrier`).

    ``action`` (picklable) runs in the process that created the barrier, once per round,
    when the last party arrives. Errors are `threading.BrokenBarrierError`.
    """

    _kind = "Barrier"

    def __init__(self, parties: int, action: Callable[[], object] | None = None,
                 timeout: float | None = None, *, ctx: object = None) -> None:
        body = (dumps_bytes(action, what="barrier action", spawning=True)
                if action is not None else b"")
        super().__init__(parties, timeout, _action=body)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for every party; return this party's index (0 .. parties-1)."""
        wait = timeout if timeout is not None else self._get("_timeout")
        return int(self._call("wait", timeout, wait=wait))

    def reset(self) -> None:
        self._call("reset")

    def abort(self) -> None:
        self._call("abort")

    parties = property(lambda self: int(self._get("parties")))
    n_waiting = property(lambda self: int(self._get("n_waiting")))
    broken = property(lambda self: bool(self._get("broken")))
