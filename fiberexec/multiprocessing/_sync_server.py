"""Server-side objects: what a broker or a manager holds for its clients, and the table
that counts their handles (`ObjectTable`).

A client call runs on a server thread (or, in the owning process, on the caller's own
thread), so "who holds the lock" is the calling client thread, named by the `Caller` the RPC
layer passes in (set in `caller` before each call). Errors carry the standard library's
types and words, so a client re-raises exactly what `multiprocessing` would.
"""

from __future__ import annotations

import importlib
import itertools
import os
import secrets
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from fiberexec.multiprocessing import _owned
from fiberexec.multiprocessing._rpc import Caller, caller_gone, caller_waits

# the standard library's semaphores (no type stubs: it is a C module of the stdlib's own)
_multiprocessing: Any = importlib.import_module("_multiprocessing")
caller = threading.local()  # .value: the Caller of the call running on this thread
TOO_MANY = "semaphore or lock released too many times"


def _me() -> Caller:
    value: Caller = getattr(caller, "value", ("", threading.get_ident()))
    return value


def _wait_time(block: bool, timeout: float | None) -> float | None:
    if not block:
        return 0.0
    return None if timeout is None else max(0.0, timeout)


class Semaphore:
    """A counting semaphore; ``maxvalue`` bounds it (a Lock is ``Semaphore(1, 1)``)."""

    def __init__(self, value: int = 1, maxvalue: int | None = None) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self._cond = threading.Condition()
        self._value, self._maxvalue = value, maxvalue
        self._owner: Caller | None = None  # the last acquirer, for a Condition's checks

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        with self._cond:
            if not caller_waits(lambda wait: self._cond.wait_for(lambda: self._value > 0, wait),
                                _wait_time(block, timeout)):
                return False
            if block and caller_gone():  # killed while it waited (see `KernelSemaphore`)
                return False
            self._value -= 1
            self._owner = _me()
            return True

    def release(self) -> None:
        with self._cond:
            if self._maxvalue is not None and self._value >= self._maxvalue:
                raise ValueError(TOO_MANY)
            self._value += 1
            self._owner = None
            self._cond.notify()

    def get_value(self) -> int:
        return self._value

    def _is_mine(self) -> bool:
        return self._value == 0 and self._owner == _me()

    def _semlock_value(self) -> int:
        return self._value

    def _semlock_count(self) -> int:
        return int(self._is_mine())

    def _release_save(self) -> int:
        self.release()
        return 1

    def _acquire_restore(self, _state: int) -> None:
        self.acquire()


class RLock:
    """A lock owned by the calling client thread, reentrant."""

    _not_owned: tuple[type[Exception], str] = (
        AssertionError, "attempt to release recursive lock not owned by thread")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: Caller | None = None
        self._count = 0

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        me = _me()
        with self._cond:
            if self._owner == me:
                self._count += 1
                return True
            if not caller_waits(
                    lambda wait: self._cond.wait_for(lambda: self._owner is None, wait),
                    _wait_time(block, timeout)):
                return False
            if block and caller_gone():  # killed while it waited (see `KernelSemaphore`)
                return False
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != _me():
                raise self._not_owned[0](self._not_owned[1])
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify()

    def _is_mine(self) -> bool:
        return self._owner == _me()

    def _semlock_value(self) -> int:
        return 0 if self._owner is not None else 1

    def _semlock_count(self) -> int:
        return self._count if self._owner == _me() else 0

    def _release_save(self) -> int:
        with self._cond:
            count, self._owner, self._count = self._count, None, 0
            self._cond.notify()
            return count

    def _acquire_restore(self, count: int) -> None:
        self.acquire()
        with self._cond:
            self._count = count


class KernelSemaphore:
    """A lock or semaphore in the kernel: the standard library's named POSIX semaphore
    (``_multiprocessing.SemLock``, in /dev/shm). Processes of this host open it by its name
    and use it directly, at the standard library's speed (`_sync`); the broker serves it to
    the others, on the thread that serves the caller (one a client thread), which is the
    thread an `RLock` counts as its owner. The name is removed when the last handle
    anywhere is dropped, or at this process's exit, and registered with the standard
    library's resource tracker meanwhile, which removes it if this process is killed."""

    RECURSIVE, COUNTING = 0, 1  # SemLock's kinds: RLock; Lock and the semaphores

    def __init__(self, kind: int, value: int, maxvalue: int) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        # named as this process's shared values are (`_sharedctypes`): the creator's pid
        self.name = f"/fiberexec-mp{os.getpid()}-sem{secrets.token_hex(6)}"
        self.kind, self.maxvalue = kind, maxvalue
        self.sem = _multiprocessing.SemLock(kind, value, maxvalue, self.name, False)
        _owned.own(self, self.name, _multiprocessing.sem_unlink, (self.name, "semaphore"))

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if not block:
            return bool(self.sem.acquire(False))
        if not caller_waits(lambda wait: bool(self.sem.acquire(True, wait)), timeout):
            return False
        if caller_gone():  # killed while it waited here: it would hold it forever
            self.sem.release()
            return False
        return True

    def release(self) -> None:
        self.sem.release()

    def get_value(self) -> int:
        return int(self.sem._get_value())

    def _is_mine(self) -> bool:
        return bool(self.sem._is_mine())

    def _semlock_value(self) -> int:
        return int(self.sem._get_value())

    def _semlock_count(self) -> int:
        return int(self.sem._count())


def _kernel_or(kind: int, value: int, maxvalue: int,
               fallback: Callable[[], Semaphore | RLock]) -> KernelSemaphore | Semaphore | RLock:
    """A `KernelSemaphore`, or where this host cannot make one (no writable /dev/shm, no
    semaphores left) the broker's own object, which every process calls."""
    try:
        return KernelSemaphore(kind, value, maxvalue)
    except OSError:
        return fallback()


_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX


class Condition:
    """A condition variable over a `Semaphore` (used as a Lock) or an `RLock` (what a
    manager's ``Condition`` is, with `threading`'s errors: `ThreadCondition`)."""

    _errors: tuple[type[Exception], str, str] = (
        AssertionError, "must acquire() condition before using wait()", "lock is not owned")

    def __init__(self, lock: Semaphore | RLock | None = None) -> None:
        self.lock = lock if lock is not None else self._default_lock()
        self._waiters: deque[threading.Event] = deque()
        self._guard = threading.Lock()

    def _default_lock(self) -> Semaphore | RLock:
        return RLock()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self.lock.acquire(block, timeout)

    def release(self) -> None:
        self.lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if not self.lock._is_mine():
            raise self._errors[0](self._errors[1])
        waiter = threading.Event()
        with self._guard:
            self._waiters.append(waiter)
        state = self.lock._release_save()
        try:
            return caller_waits(waiter.wait, None if timeout is None else max(0.0, timeout))
        finally:
            with self._guard:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            self.lock._acquire_restore(state)

    def notify(self, n: int = 1) -> None:
        if not self.lock._is_mine():
            raise self._errors[0](self._errors[2])
        with self._guard:
            for _ in range(min(n, len(self._waiters))):
                self._waiters.popleft().set()

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class ThreadRLock(RLock):
    """An `RLock` with `threading.RLock`'s errors (what a manager's ``RLock`` is)."""

    _not_owned = (RuntimeError, "cannot release un-acquired lock")


class ThreadCondition(Condition):
    """A `Condition` with `threading.Condition`'s errors (a manager's ``Condition``)."""

    _errors = (RuntimeError, "cannot wait on un-acquired lock",
               "cannot notify on un-acquired lock")

    def _default_lock(self) -> Semaphore | RLock:
        return ThreadRLock()


class Barrier(threading.Barrier):
    """`threading.Barrier`; the action (if any) runs in the process that holds it."""


def _semaphore(value: int = 1, bounded: bool = False) -> KernelSemaphore | Semaphore | RLock:
    top = value if bounded else None
    return _kernel_or(KernelSemaphore.COUNTING, value, _MAX if top is None else top,
                      lambda: Semaphore(value, top))


# what a broker holds for `_sync` (a condition and an event are made of these, by `_sync`)
KINDS: dict[str, Callable[..., Any]] = {
    "Lock": lambda: _kernel_or(KernelSemaphore.COUNTING, 1, 1, lambda: Semaphore(1, 1)),
    "RLock": lambda: _kernel_or(KernelSemaphore.RECURSIVE, 1, 1, RLock),
    "Semaphore": _semaphore,
    "BoundedSemaphore": lambda value=1: _semaphore(value, bounded=True),
    "Barrier": lambda parties, timeout=None, action=None: Barrier(parties, action, timeout),
}


# ---------------------------------------------------------------------------- the table

class ObjectTable:
    """Objects by id, each with its kind and its live handles, counted by the process that
    holds them (its token, see `_rpc.Caller`); thread-safe.

    Both object servers keep their objects here: a process's broker (`Lock`, `Event` and
    the rest of `_sync`) and a manager's server (`_managers`). As the standard library's
    managers count proxies, creating an object gives it its first reference (the handle made
    for it, held by the process that asked), unpickling a handle adds one (``incref``), and
    a handle garbage collected, or held by a process that ends, releases its own
    (``decref``, sent in batches by `_proxies`' releaser). A process killed before it could
    release its handles is dropped as a whole once its server sees it gone
    (``drop_holder``, see `_rpc.Callers`), as if it had ended normally; a call of it that
    was under way and is answered after that counts nothing. The last release
    frees the object, outside the table's lock: freeing it may release handles it held,
    whose releases come back here.

    ``owner`` and ``handle`` name the server and its handles in the error for an id that is
    gone (``"manager"``, ``"proxy"``)."""

    def __init__(self, owner: str, handle: str) -> None:
        self.owner, self.handle = owner, handle
        self._objects: dict[int, tuple[Any, str]] = {}
        self._refs: dict[int, int] = {}  # id -> its handles, in every process
        self._held: dict[str, Counter[int]] = {}  # process token -> id -> its handles there
        # processes dropped as gone whose calls may still come (`_rpc.Callers`): not counted
        self._gone: set[str] = set()
        self._ids = itertools.count(1)
        # re-entrant: freeing an object may free handles it held, whose releases come here
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._objects)

    def add(self, obj: Any, kind: str, holder: str) -> int:
        """Keep ``obj``; the handle made for it in ``holder``'s process holds its first
        reference."""
        with self._lock:
            oid = next(self._ids)
            if holder in self._gone:  # made for a process that is gone: it goes at once
                return oid
            self._objects[oid] = (obj, kind)
            self._refs[oid] = 1
            self._held.setdefault(holder, Counter())[oid] += 1
        return oid

    def get(self, oid: int) -> tuple[Any, str]:
        """The object ``oid`` and its kind; `ReferenceError` if it was freed."""
        try:
            return self._objects[oid]
        except KeyError:
            raise ReferenceError(
                f"the {self.owner} holds no object {oid}: it was freed when the last "
                f"{self.handle} to it was dropped; keep a {self.handle} alive while other "
                "processes may still receive copies of it") from None

    def incref(self, oid: int, holder: str) -> None:
        with self._lock:
            self.get(oid)
            if holder in self._gone:  # (a late call: what it held was released)
                return
            self._refs[oid] += 1
            self._held.setdefault(holder, Counter())[oid] += 1

    def decref(self, oids: Iterable[int], holder: str) -> None:
        """``holder`` dropped a handle to each of ``oids``. One it was never counted for is
        not its to release (a copy a forked child inherited from the process that holds
        it), nor one of a holder already dropped as gone."""
        freed: list[tuple[Any, str]] = []
        with self._lock:
            held = self._held.get(holder)
            for oid in oids:
                if held is None or held[oid] <= 0:
                    continue
                held[oid] -= 1
                if not held[oid]:
                    del held[oid]
                self._release(oid, 1, freed)
            if held is not None and not held:
                del self._held[holder]
        freed.clear()  # the objects go here, outside the lock

    def drop_holder(self, holder: str) -> None:
        """``holder``'s process is gone: release every handle it held (it never will); a
        call of it that still comes counts nothing, until `forget_holder`."""
        freed: list[tuple[Any, str]] = []
        with self._lock:
            self._gone.add(holder)
            for oid, count in self._held.pop(holder, Counter()).items():
                self._release(oid, count, freed)
        freed.clear()  # the objects go here, outside the lock

    def forget_holder(self, holder: str) -> None:
        """No call of ``holder``, dropped as gone, can come any more."""
        with self._lock:
            self._gone.discard(holder)

    def _release(self, oid: int, count: int, freed: list[tuple[Any, str]]) -> None:
        """Take ``count`` references off ``oid`` (under the lock); the last frees it, into
        ``freed``."""
        left = self._refs.get(oid, 0) - count
        if left > 0:
            self._refs[oid] = left
        elif oid in self._refs:
            del self._refs[oid]
            freed.append(self._objects.pop(oid))

    def debug_info(self) -> str:
        with self._lock:
            return "".join(f"  {oid}: refcount={self._refs[oid]}\n    {str(obj)[:75]}\n"
                           for oid, (obj, _) in sorted(self._objects.items()))
