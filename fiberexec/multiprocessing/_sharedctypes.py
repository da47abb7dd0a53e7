"""`Value`, `Array`, `RawValue`, `RawArray`: ctypes objects in memory shared by processes.

    RawArray("d", 8)   -> a file in /dev/shm (16-byte token, then the data), mapped here;
                          the ctypes object is a view of the mapping (zero copy); where
                          /dev/shm has no room for it, a file in the temporary directory
    pickle(it)         -> (type, file name, token, the creator's broker address and secret)
    unpickle elsewhere -> the file is there with the same token: map it (same host: zero
                          copy, exactly like the standard library);
                          else: a `Remote*` object reading and writing the creator's
                          memory through its broker (another host: every access is a
                          round trip, and there is no buffer to hand to numpy)

The file is removed when the creating process drops its object (or exits); processes that
mapped it keep their mapping. A creator killed before that leaves it to the standard
library's resource tracker, which removes it (and warns of it) as it does a leaked
`SharedMemory`. `Value`/`Array` wrap the object with a lock (`RLock` by
default), as `multiprocessing.sharedctypes` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import multiprocessing.sharedctypes as _std_sharedctypes
import os
import secrets
import tempfile
import weakref
from typing import Any

from fiberexec import _shm
from fiberexec.multiprocessing import _broker as b
from fiberexec.multiprocessing import _owned
from fiberexec.multiprocessing._rpc import Endpoint

HEADER = b.SHARED_HEADER  # a token: "the same file", not "a file of the same name"
_TYPECODES: dict[str, Any] = _std_sharedctypes.typecode_to_type  # type: ignore[attr-defined]
_shared_types: dict[Any, Any] = {}
_mapped: weakref.WeakValueDictionary[str, mmap.mmap] = weakref.WeakValueDictionary()


def _ctype(typecode_or_type: Any) -> Any:
    return _TYPECODES.get(typecode_or_type, typecode_or_type)


def _shared_type(base: Any) -> Any:
    """``base`` with a ``__reduce__`` that shares instead of copying (one class per base)."""
    cls = _shared_types.get(base)
    if cls is None:
        namespace: dict[str, Any] = {"__reduce__": _reduce, "__module__": __name__}
        if issubclass(base, ctypes._SimpleCData):  # shown as the stdlib's: c_int(3)
            namespace["__repr__"] = _simple_repr
        cls = type(base.__name__, (base,), namespace)
        _shared_types[base] = cls
    return cls


def _simple_repr(obj: Any) -> str:
    return f"{type(obj).__name__}({obj.value!r})"


def _new(type_: Any) -> Any:
    size = HEADER + ctypes.sizeof(type_)
    token = secrets.token_bytes(HEADER)
    name = f"{_shm.PREFIX}mp{os.getpid()}-{secrets.token_hex(8)}"
    mapping = None
    for directory in _directories():
        mapping = _file_mapping(os.path.join(directory, name), size)
        if mapping is not None:
            if directory != _shm.SHM_DIR:
                name = os.path.join(directory, name)  # a path: `_attach` finds it there
            break
    else:  # no room in a file: private memory, other processes reach it through the broker
        mapping = mmap.mmap(-1, size)
    mapping[:HEADER] = token
    _mapped[name] = mapping
    return _view(type_, mapping, name, token)


def _directories() -> list[str]:
    """Where a shared object's file may go: /dev/shm, then (as the standard library's heap
    does when /dev/shm is too small, a container's 64 MiB, say) the temporary directory."""
    return [_shm.SHM_DIR] * _shm.available() + [tempfile.gettempdir()]


def _file_mapping(path: str, size: int) -> mmap.mmap | None:
    """A new file of ``size`` bytes at ``path``, its pages allocated now, mapped (removed
    when the mapping is collected); None when its file system has no room for it. A file
    mapped with pages it cannot get would kill the process (SIGBUS) at its first write."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                _unlink(path)
                return None
            os.ftruncate(fd, size)  # a file system without fallocate: pages on first use
        mapping = mmap.mmap(fd, size)
    except OSError:
        _unlink(path)
        return None
    finally:
        os.close(fd)
    in_shm = os.path.dirname(path) == _shm.SHM_DIR  # the tracker removes only those
    _owned.own(mapping, path, os.unlink,
               ("/" + os.path.basename(path), "shared_memory") if in_shm else None)
    return mapping


def _view(type_: Any, mapping: mmap.mmap, name: str, token: bytes) -> Any:
    obj = _shared_type(type_).from_buffer(mapping, HEADER)
    obj.__dict__["_fx_shared"] = (type_, name, token, None)
    return obj


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _reduce(obj: Any) -> tuple[Any, ...]:
    type_, name, token, endpoint = obj.__dict__["_fx_shared"]
    if endpoint is None:  # created here: serve it to processes that cannot map it
        mapping = _mapped.get(name)
        broker = b.get_broker()
        if mapping is not None and name not in broker.buffers:
            broker.buffers[name] = weakref.ref(mapping)
        endpoint = broker.endpoint
    return (_rebuild, (*_type_key(type_), name, token, endpoint.address, endpoint.secret))


def _type_key(type_: Any) -> tuple[type, int | None]:
    """(element type, length) for an array, (type, None) otherwise: array types have no
    importable name, so they travel as the element type and the length (as in the stdlib)."""
    if issubclass(type_, ctypes.Array):
        return type_._type_, type_._length_
    return type_, None


def _rebuild(  # noqa: PLR0917  # a pickle's reconstructor takes its arguments positionally
        base: Any, length: int | None, name: str, token: bytes, address: str,
        secret: bytes) -> Any:
    type_ = base if length is None else base * length
    mapping = _mapped.get(name) or _attach(name, token)
    if mapping is not None:
        obj = _view(type_, mapping, name, token)
        obj.__dict__["_fx_shared"] = (type_, name, token, Endpoint(address, secret))
        return obj
    return remote(type_, name, Endpoint(address, secret))


def _attach(name: str, token: bytes) -> mmap.mmap | None:
    """Map the creator's file if this host sees it (and it is the same file)."""
    try:  # a name in /dev/shm, or a path (`_new`)
        fd = os.open(os.path.join(_shm.SHM_DIR, name), os.O_RDWR)
    except (OSError, ValueError):
        return None
    try:
        mapping = mmap.mmap(fd, 0)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if mapping[:HEADER] != token:
        mapping.close()
        return None
    _mapped[name] = mapping
    return mapping


def remote(type_: Any, name: str, endpoint: Endpoint) -> Any:
    from fiberexec.multiprocessing._sharedremote import RemoteArray, RemoteValue

    if issubclass(type_, ctypes.Array):
        return RemoteArray(type_, name, endpoint)
    return RemoteValue(type_, name, endpoint)


def remote_by_key(base: Any, length: int | None, name: str, address: str,
                  secret: bytes) -> Any:
    return remote(base if length is None else base * length, name, Endpoint(address, secret))


def RawValue(typecode_or_type: Any, *args: Any) -> Any:
    """A ctypes object in shared memory, initialised with ``args`` (zeroed otherwise)."""
    obj = _new(_ctype(typecode_or_type))
    obj.__init__(*args)
    return obj


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Any:
    """A ctypes array in shared memory: ``size`` zeros, or a copy of an initializer."""
    type_ = _ctype(typecode_or_type)
    if isinstance(size_or_initializer, int):
        return _new(type_ * size_or_initializer)
    values = list(size_or_initializer)
    obj = _new(type_ * len(values))
    obj.__init__(*values)
    return obj


def copy(obj: Any) -> Any:
    """A new shared ctypes object holding a copy of ``obj``'s bytes (``sharedctypes.copy``)."""
    type_ = type(obj)
    if type_ in _shared_types.values():
        type_ = type_.__mro__[1]  # the ctypes type our shared subclass was made from
    new = _new(type_)
    ctypes.memmove(ctypes.addressof(new), ctypes.addressof(obj), ctypes.sizeof(type_))
    return new


def _lock_for(lock: Any) -> Any:
    if lock is True or lock is None:
        from fiberexec.multiprocessing._sync import RLock

        return RLock()
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    return lock


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: object = None) -> Any:
    """A `RawValue` wrapped with a lock (``lock=False``: the raw object itself)."""
    obj = RawValue(typecode_or_type, *args)
    if lock is False:
        return obj
    return synchronized(obj, _lock_for(lock))


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True,
          ctx: object = None) -> Any:
    """A `RawArray` wrapped with a lock (``lock=False``: the raw array itself)."""
    obj = RawArray(typecode_or_type, size_or_initializer)
    if lock is False:
        return obj
    return synchronized(obj, _lock_for(lock))


def synchronized(obj: Any, lock: Any = None) -> Any:
    from fiberexec.multiprocessing import _synchronized as s

    if isinstance(obj, ctypes.Array):
        if obj._type_ is ctypes.c_char:
            return s.SynchronizedString(obj, _lock_for(lock))
        return s.SynchronizedArray(obj, _lock_for(lock))
    if isinstance(obj, ctypes.Structure):
        return s.synchronized_structure(obj, _lock_for(lock))
    return s.Synchronized(obj, _lock_for(lock))
