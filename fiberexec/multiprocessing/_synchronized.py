"""Lock-holding wrappers of shared ctypes objects (`multiprocessing.sharedctypes`' classes).

Unlike the standard library's, they pickle: the object and its lock pickle on their own
(shared memory and a broker lock), so a wrapper works in a `Process` or a `Pool` task.
"""

from __future__ import annotations

from typing import Any


class Synchronized:
    """A shared object and its lock; ``value`` reads and writes under the lock."""

    def __init__(self, obj: Any, lock: Any) -> None:
        self._obj, self._lock = obj, lock
        self.acquire, self.release = lock.acquire, lock.release

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._obj, self._lock))

    def get_obj(self) -> Any:
        """The wrapped ctypes object (in shared memory)."""
        return self._obj

    def get_lock(self) -> Any:
        """The lock that `value` and item access hold."""
        return self._lock

    def __enter__(self) -> Any:
        return self._lock.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.__exit__(*exc_info)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} wrapper for {self._obj!r}>"

    # (``acquire``/``release``, not ``with``: a lock open on this host binds its
    # semaphore's own methods, so a read is a C call either side, as in the stdlib)
    @property
    def value(self) -> Any:
        self.acquire()
        try:
            return self._obj.value
        finally:
            self.release()

    @value.setter
    def value(self, value: Any) -> None:
        self.acquire()
        try:
            self._obj.value = value
        finally:
            self.release()


class SynchronizedArray(Synchronized):
    """A shared array: ``len``, items and slices, each access under the lock."""

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, key: Any) -> Any:
        self.acquire()
        try:
            return self._obj[key]
        finally:
            self.release()

    def __setitem__(self, key: Any, value: Any) -> None:
        self.acquire()
        try:
            self._obj[key] = value
        finally:
            self.release()


class SynchronizedString(SynchronizedArray):
    """A shared ``c_char`` array with ``value`` (up to NUL) and ``raw`` (all bytes)."""

    @property
    def raw(self) -> bytes:
        with self._lock:
            data: bytes = self._obj.raw
            return data

    @raw.setter
    def raw(self, value: bytes) -> None:
        with self._lock:
            self._obj.raw = value


class _SynchronizedFields(Synchronized):
    """The base of `synchronized_structure`'s classes (which are made at run time)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (synchronized_structure, (self._obj, self._lock))


_FIELD_WRAPPERS: dict[type, type[_SynchronizedFields]] = {}


def synchronized_structure(obj: Any, lock: Any) -> Synchronized:
    """A shared ctypes ``Structure`` and its lock, each of its fields a property read and
    written under the lock: ``SynchronizedPoint`` for a ``Point``, as the stdlib's. (In a
    process on another host, which reaches the memory through the broker as a value with
    no fields, a plain `Synchronized`: a structure is shared on this host only.)"""
    cls = type(obj)
    if not hasattr(cls, "_fields_"):  # reached from another host: no fields to read there
        return Synchronized(obj, lock)
    wrapper = _FIELD_WRAPPERS.get(cls)
    if wrapper is None:
        fields = {name: _field(name) for name, *_ in cls._fields_}
        wrapper = type(f"Synchronized{cls.__name__}", (_SynchronizedFields,), fields)
        _FIELD_WRAPPERS[cls] = wrapper
    return wrapper(obj, lock)


def _field(name: str) -> property:
    def get(self: Synchronized) -> Any:
        with self._lock:
            return getattr(self._obj, name)

    def put(self: Synchronized, value: Any) -> None:
        with self._lock:
            setattr(self._obj, name, value)

    return property(get, put, doc=f"the field {name!r}, under the lock")
