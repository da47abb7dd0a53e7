"""`Lock`, `RLock`, `Semaphore`, `BoundedSemaphore`, `Condition`, `Event`, `Barrier`.

    Lock()           -> the creating process's broker makes a kernel semaphore, the standard
                        library's named one (`_sync_server.KernelSemaphore`), and counts the
                        handles to it
    lock.acquire()   -> in a process of the creator's host, the semaphore itself (as fast as
                        the standard library's); anywhere else, `_calls.CallObject(id,
                        "acquire")` to the broker, which acquires the same semaphore there
    pickle(lock)     -> (broker address, secret, id, the semaphore's name): works in a
                        Process, a Pool task or a manager call, on every backend, because every
                        process can reach the broker that started it; a process that cannot
                        open the name (another host, a container with its own /dev/shm) calls
    del lock         -> the broker frees the object, and removes the name, once no copy of
                        the handle is left in any process (`_sync_server.ObjectTable`), as a
                        manager frees the referent of its last proxy

`Condition` and `Event` are made of these, as the standard library makes them of its
semaphores, so they are as fast where the semaphores are; `Barrier` is held by the broker.
Blocking calls to the broker that may be retried (acquire) wait there in slices of at most
`Timing.slice` seconds, so a client that vanishes holds a server thread for one slice.
`Barrier.wait` cannot be split without changing its meaning, so it waits in one call for
the whole timeout. Where the host cannot make a kernel semaphore, the broker holds a lock
of its own and every process calls it.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from fiberexec._serialize import dumps_bytes
from fiberexec.multiprocessing import _broker as b
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._proxies import _releaser
from fiberexec.multiprocessing._rpc import Endpoint
from fiberexec.multiprocessing._sync_server import _multiprocessing

BrokenBarrierError = threading.BrokenBarrierError
T = TypeVar("T")


class _Shared:
    """A handle on an object held by a broker; pickles to (address, secret, id)."""

    _kind = ""

    def __init__(self, *args: Any, _action: bytes = b"") -> None:
        broker = b.get_broker()
        self._endpoint: Endpoint = broker.endpoint
        self._oid: int = self._endpoint.call(calls.NewObject(self._kind, args), _action)[0]
        _releaser.watch(self, self._endpoint.address, self._endpoint.secret, self._oid)

    def __reduce__(self) -> tuple[Any, ...]:
        ep = self._endpoint
        return (_rebuild, (type(self), ep.address, ep.secret, self._oid))

    def _call(self, name: str, *args: Any, wait: float | None = 0.0) -> Any:
        timeout = None if wait is None else wait + _timing.TIMING.call
        return self._endpoint.call(calls.CallObject(self._oid, name, args), timeout=timeout)[0]

    def _get(self, name: str) -> Any:
        return self._endpoint.call(calls.ObjectAttr(self._oid, name))[0]

    def _blocking(self, name: str, block: bool, timeout: float | None) -> bool:
        if not block:
            return bool(self._call(name, False))
        return _timing.in_slices(timeout, lambda w: bool(self._call(name, True, w, wait=w)))


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


class _SemLockView:
    """``_semlock`` of a lock or semaphore this process calls the broker for: what the
    standard library's own code reads of a lock it was given (its `queues.Queue` made with
    this module's context asks ``_is_zero()`` in ``full()``), and what `Condition` reads,
    answered by the broker. Where the semaphore is open here, ``_semlock`` is the standard
    library's own `_multiprocessing.SemLock`."""

    def __init__(self, owner: _SemLock) -> None:
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


# The kernel semaphores open in this process, by name, with the count of handles here that
# use each: the handles of one name share one `SemLock`, whose count of a thread's
# acquisitions is how an `RLock` (and `Condition.wait`) knows its owner.
_opened: dict[str, list[Any]] = {}
_opened_lock = threading.Lock()


def _open(name: str, kind: int, maxvalue: int, sem: Any = None) -> Any:
    """The semaphore ``name`` for one more handle here: ``sem`` (the creator's own), the
    one open already, or opened now; None where it cannot be opened (another host, a
    container with a /dev/shm of its own, the name gone): that handle calls the broker."""
    with _opened_lock:
        entry = _opened.get(name)
        if entry is None:
            if sem is None:
                try:
                    sem = _multiprocessing.SemLock._rebuild(0, kind, maxvalue, name)
                except OSError:
                    return None
            entry = _opened[name] = [sem, 0]
        entry[1] += 1
        return entry[0]


def _close(name: str) -> None:
    """A handle of ``name`` here was dropped (the semaphore closes with its last)."""
    with _opened_lock:
        entry = _opened.get(name)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del _opened[name]


def _forked() -> None:
    """In a forked child no thread holds what its parent's threads held (as the standard
    library's locks reset in a child)."""
    for sem, _ in list(_opened.values()):
        sem._after_fork()


os.register_at_fork(after_in_child=_forked)


class _SemLock(_Shared):
    """A lock or semaphore: the kernel semaphore itself where it can be opened here, else
    calls to the broker that holds it (see the module)."""

    _sem: Any = None  # the `_multiprocessing.SemLock`, or None: calls to the broker
    _name = ""  # the kernel semaphore's name ("": the broker's own lock)
    _sem_kind = 0

    def __init__(self, *args: Any, maxvalue: int) -> None:
        super().__init__(*args)
        self._maxvalue = maxvalue
        held = b.get_broker().obj(self._oid)  # (this process's broker: no call)
        if hasattr(held, "sem"):
            self._attach(held.name, held.kind, held.sem)

    def _attach(self, name: str, kind: int, sem: Any = None) -> None:
        self._name, self._sem_kind = name, kind
        self._sem = _open(name, kind, self._maxvalue, sem)
        if self._sem is not None:
            weakref.finalize(self, _close, name)
            # the semaphore's own methods, as the stdlib's locks have them: no Python call
            # in between on the hot path (a handle pickles by `__reduce__`, without these)
            self.acquire, self.release = self._sem.acquire, self._sem.release  # type: ignore[method-assign]

    def __reduce__(self) -> tuple[Any, ...]:
        ep = self._endpoint
        return (_rebuild_semlock, (type(self), ep.address, ep.secret, self._oid,
                                   (self._name, self._sem_kind, self._maxvalue)))

    # (a handle whose semaphore is open here has the semaphore's own two instead: `_attach`)
    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Acquire; with ``block=False`` or a ``timeout``, False if it could not."""
        return self._blocking("acquire", block, timeout)

    def release(self) -> None:
        self._call("release")

    def __enter__(self) -> bool:
        sem = self._sem
        return bool(sem.__enter__()) if sem is not None else self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        sem = self._sem
        if sem is not None:
            sem.__exit__(*exc_info)
        else:
            self.release()

    @property
    def _semlock(self) -> Any:
        return self._sem if self._sem is not None else _SemLockView(self)

    def _owner(self) -> str:
        """Who holds it, in the words of the standard library's reprs."""
        semlock = self._semlock
        if semlock._is_mine():
            name = _process_name()
            if threading.current_thread() is not threading.main_thread():
                name += "|" + threading.current_thread().name
            return name
        if semlock._get_value() == 1:
            return "None"
        return "SomeOtherThread" if semlock._count() > 0 else "SomeOtherProcess"


def _process_name() -> str:
    from fiberexec.multiprocessing import current_process

    return str(current_process().name)


def _rebuild_semlock(cls: type[_SemLock], address: str, secret: bytes, oid: int,
                     sem: tuple[str, int, int]) -> _Shared:
    """A copy (see `_rebuild`) that opens the kernel semaphore ``(name, kind, maxvalue)``
    if it can."""
    name, kind, maxvalue = sem
    obj = _rebuild(cls, address, secret, oid)
    assert isinstance(obj, _SemLock)
    obj._maxvalue = maxvalue
    if name:
        obj._attach(name, kind)
    return obj


class Semaphore(_SemLock):
    """A counter shared by processes (`multiprocessing.Semaphore`)."""

    _kind = "Semaphore"

    def __init__(self, value: int = 1, *, ctx: object = None) -> None:
        super().__init__(value, maxvalue=_multiprocessing.SemLock.SEM_VALUE_MAX)

    def get_value(self) -> int:
        return int(self._semlock._get_value())

    def __repr__(self) -> str:
        try:
            value: object = self.get_value()
        except Exception:
            value = "unknown"
        bound = f", maxvalue={self._maxvalue}" if isinstance(self, BoundedSemaphore) else ""
        return f"<{type(self).__name__}(value={value}{bound})>"


class BoundedSemaphore(Semaphore):
    """A `Semaphore` whose ``release`` past its initial value raises ValueError."""

    _kind = "BoundedSemaphore"

    def __init__(self, value: int = 1, *, ctx: object = None) -> None:
        _SemLock.__init__(self, value, maxvalue=value)


class Lock(_SemLock):
    """A non-recursive lock shared by processes (`multiprocessing.Lock`).

    Any process may release it; releasing it when unlocked raises ValueError.
    """

    _kind = "Lock"

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__(maxvalue=1)

    def __repr__(self) -> str:
        try:
            owner = self._owner()
        except Exception:
            owner = "unknown"
        return f"<{type(self).__name__}(owner={owner})>"


class RLock(_SemLock):
    """A recursive lock owned by the thread (in whichever process) that acquired it."""

    _kind = "RLock"

    def __init__(self, *, ctx: object = None) -> None:
        super().__init__(maxvalue=1)

    def __repr__(self) -> str:
        try:
            owner = self._owner()
            count: object = (self._semlock._count() if owner not in
                             ("None", "SomeOtherThread", "SomeOtherProcess") else
                             0 if owner == "None" else "nonzero")
        except Exception:
            owner, count = "unknown", "unknown"
        return f"<{type(self).__name__}({owner}, {count})>"


class Condition:
    """A condition variable shared by processes (`multiprocessing.Condition`), made of
    semaphores as the standard library's is (with its names): a waiter counts itself in
    ``_sleeping_count`` while it holds the lock, so a notify (which needs the lock) sees
    every waiter that has begun; it wakes up to n of them through ``_wait_semaphore`` and
    waits until each has said so in ``_woken_count`` (a waiter whose timeout ran out says
    so too).

    Args:
        lock: a `Lock` or `RLock` of this module to use (default: a new `RLock`).
    """

    def __init__(self, lock: Lock | RLock | None = None, *, ctx: object = None) -> None:
        if lock is not None and not isinstance(lock, Lock | RLock):
            raise TypeError(f"lock must be a Lock or RLock of this module, got {lock!r}")
        self._lock: Lock | RLock = lock if lock is not None else RLock()
        self._sleeping_count = Semaphore(0)
        self._woken_count = Semaphore(0)
        self._wait_semaphore = Semaphore(0)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._lock.acquire(block, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify or ``timeout``, re-acquire; True if notified."""
        semlock = self._lock._semlock
        if not semlock._is_mine():
            raise AssertionError("must acquire() condition before using wait()")
        self._sleeping_count.release()
        depth = semlock._count()  # an RLock held n times is released n times, and retaken
        for _ in range(depth):
            self._lock.release()
        try:
            return self._wait_semaphore.acquire(True, timeout)
        finally:
            self._woken_count.release()
            for _ in range(depth):
                self._lock.acquire()

    def wait_for(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """Wait until ``predicate()`` is true (it is evaluated here, holding the lock)."""
        return _timing.wait_until(predicate, self.wait, timeout)

    def notify(self, n: int = 1) -> None:
        if not self._lock._semlock._is_mine():
            raise AssertionError("lock is not owned")
        while self._woken_count.acquire(False):  # waiters gone since (timed out)
            self._sleeping_count.acquire(False)
        woken = 0
        while woken < n and self._sleeping_count.acquire(False):
            self._wait_semaphore.release()
            woken += 1
        for _ in range(woken):
            self._woken_count.acquire()  # each one woken (or timed out meanwhile) says so
        while self._wait_semaphore.acquire(False):  # a wake left by a waiter that timed out
            pass

    def notify_all(self) -> None:
        self.notify(sys.maxsize)

    def __repr__(self) -> str:
        try:
            waiters: object = self._sleeping_count.get_value() - self._woken_count.get_value()
        except Exception:
            waiters = "unknown"
        return f"<{type(self).__name__}({self._lock}, {waiters})>"


class Event:
    """A flag processes can set, clear and wait for (`multiprocessing.Event`): a
    semaphore guarded by a `Condition`, as the standard library's."""

    def __init__(self, *, ctx: object = None) -> None:
        self._cond = Condition(Lock())
        self._flag = Semaphore(0)

    def is_set(self) -> bool:
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

    def set(self) -> None:
        with self._cond:
            self._flag.acquire(False)
            self._flag.release()
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._flag.acquire(False)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set or ``timeout`` passes; return the flag."""
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
                return True
            self._cond.wait(timeout)
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

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
