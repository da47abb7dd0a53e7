"""Pickling the stdlib's process-shared objects for workers on this host, as for a spawned child.

The standard library pickles a `ProcessPoolExecutor`'s ``initargs`` while it spawns each
worker, and so accepts objects that may only be shared with a child: a
``multiprocessing.Queue`` (a logging ``QueueHandler``'s queue, say), ``Lock``, ``Value``,
``Array``. fiberexec pickles an initializer once, for every worker it will start. `dumps`
does that in the stdlib's spawning mode, with the stdlib's own reducers:

* a lock or semaphore pickles as its name, which a worker reopens (the stdlib's own way;
  one made under the ``"fork"`` start method has no name, and the stdlib says so), if it
  has the same ``/dev/shm`` (otherwise it is told where the lock can be used instead);
* a file descriptor (a queue's pipe, a shared heap's file) pickles as this process's pid
  and descriptor number; a worker opens ``/proc/<pid>/fd/<n>``, which is the same pipe or
  file, as often as workers start. A worker in another pid namespace (a container, another
  host) is told where the object can be used instead. Sockets cannot be reopened that way,
  and are refused here.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import os
import stat
import sys
import threading
import types
import typing
from collections import ChainMap
from collections.abc import Callable, Iterator
from multiprocessing import context, synchronize
from multiprocessing.reduction import ForkingPickler
from typing import Any, ClassVar

import cloudpickle

from fiberexec import _ctypes_byvalue
from fiberexec._codenames import reduce_code

_FIX = ("pass a fiberexec.multiprocessing object (Queue, Lock, Value...) or a "
        "Manager's proxy instead: those work on every backend")


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _shm_identity() -> tuple[int, int] | None:
    """Which ``/dev/shm`` this process has (named semaphores live there); None without."""
    try:
        found = os.stat("/dev/shm")
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _reduce_semlock(lock: synchronize.SemLock) -> tuple[Any, ...]:
    # the stdlib's own state (its checks: spawning only, no fork-context lock), plus where
    # its name can be opened
    return _rebuild_semlock, (type(lock), lock.__getstate__(), _shm_identity())


def _rebuild_semlock(cls: type[synchronize.SemLock], state: Any,
                     shm: tuple[int, int] | None) -> synchronize.SemLock:
    if shm != _shm_identity():
        raise OSError(
            f"a stdlib multiprocessing {cls.__name__} is reopened by its name in /dev/shm, "
            f"which this worker cannot see (it has another /dev/shm: another host, or a "
            f"container); {_FIX}")
    lock = cls.__new__(cls)
    lock.__setstate__(state)  # type: ignore[attr-defined]
    return lock


def _refuse_file(file: io.TextIOWrapper) -> Any:
    """An open file is refused, in the standard library's words: cloudpickle would send a
    readable one as a copy of what is left to read, where writes are lost unseen. (The
    standard streams stay what cloudpickle makes them: the worker's own.)"""
    if file is sys.stdout or file is sys.stderr or file is sys.stdin:
        return cloudpickle.Pickler.dispatch_table[io.TextIOWrapper](file)
    kind = type(file)
    raise TypeError(f"cannot pickle '{kind.__module__}.{kind.__qualname__}' object: an open "
                    "file stays in this process (pass its path, and open it in the task)")


class _Anew:
    """A lock or a thread-local that a function pickled by value reads as a global: made
    anew where it arrives (unlocked, empty), as a worker that imported the script would
    make it. Passed as an argument instead, such an object still cannot be pickled: the
    task could only think it shares it."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def __reduce__(self) -> tuple[Callable[[], Any], tuple[()]]:
        return self.make, ()


_ANEW: dict[type, Callable[[], Any]] = {
    type(threading.Lock()): threading.Lock,
    type(threading.RLock()): threading.RLock,
    threading.local: threading.local,
}


def _globals_anew(reduced: Any) -> Any:
    """cloudpickle's reduction of a function by value (``(make, args, (state, slotstate),
    ...)``, its globals a dict made for the pickle), with its locks and thread-locals as
    `_Anew`."""
    state = reduced[2] if type(reduced) is tuple and len(reduced) > 2 else None
    slots = state[1] if type(state) is tuple and len(state) == 2 else None
    space = slots.get("__globals__") if type(slots) is dict else None
    if type(space) is dict:
        for name, value in space.items():
            make = _ANEW.get(type(value))
            if make is not None:
                space[name] = _Anew(make)
    return reduced


def _reduce_cached_property(prop: functools.cached_property[Any]) -> Any:
    """A script class's ``functools.cached_property`` (pickled with its class, by value):
    its function and the name it caches under, without its lock (a ``threading.RLock`` up
    to Python 3.11, which no pickler takes)."""
    return _cached_property, (prop.func, prop.attrname, prop.__doc__)


def _cached_property(func: Callable[[Any], Any], attrname: str | None,
                     doc: str | None) -> functools.cached_property[Any]:
    prop = functools.cached_property(func)
    prop.attrname = attrname  # (set as the class was made, which rebuilding it does not do)
    prop.__doc__ = doc
    return prop


class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with code keeping its file's name, the standard library
    multiprocessing's reducers first (the
    pickler reads its class's table as it is made; later registrations are seen),
    stdlib locks that check, where they are rebuilt, that their name can be opened there,
    and a script's ctypes structures made again where they arrive (`_ctypes_byvalue`)."""

    dispatch_table: ClassVar[ChainMap[type, Any]] = ChainMap(
        {types.CodeType: reduce_code},  # tracebacks name the real file (see `_codenames`)
        {io.TextIOWrapper: _refuse_file},
        {functools.cached_property: _reduce_cached_property},
        {kind: _reduce_semlock for kind in (synchronize.Lock, synchronize.RLock,
                                            synchronize.Semaphore, synchronize.BoundedSemaphore)},
        ForkingPickler._extra_reducers,  # type: ignore[attr-defined]
        cloudpickle.Pickler.dispatch_table,
    )

    functions_as_bytes = False  # a function by value as its kept bytes (`_functions`)

    def reducer_override(self, obj: Any) -> Any:
        if _ctypes_byvalue.wanted(obj):  # a script's ctypes structure: see the module
            return _ctypes_byvalue.reduce(obj)
        if self.functions_as_bytes and type(obj) is types.FunctionType:
            from fiberexec import _functions

            reduced = _functions.reduce(obj)
            if reduced is not None:
                return reduced
        if type(obj) is types.FunctionType:
            return _globals_anew(super().reducer_override(obj))
        if isinstance(obj, type):
            return _made_whole(obj, super().reducer_override(obj))
        return super().reducer_override(obj)


_SKELETON = getattr(cloudpickle.cloudpickle, "_make_skeleton_class", None)
_TRACKED = getattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_ID", {})


def _known_or_made(type_constructor: type, name: str, bases: tuple[Any, ...],  # noqa: PLR0917
                   type_kwargs: dict[str, Any], class_tracker_id: str | None,
                   extra: Any) -> type:
    """A class pickled by value, as cloudpickle's `_make_skeleton_class` makes it, but
    the one this process has already where it has it (the caller's own, a class an earlier
    task brought). cloudpickle made the class anew before looking, which ran its bases'
    ``__init_subclass__`` (and a metaclass) again at every unpickling: a registry of
    subclasses grew by one each time, or refused the name it already held, in the worker
    and, for results, in the caller."""
    if class_tracker_id is not None:
        known = _TRACKED.get(class_tracker_id)
        if known is not None:
            return known  # type: ignore[no-any-return]
    assert _SKELETON is not None  # (a reduction naming it was made: see `_made_whole`)
    return _SKELETON(type_constructor, name, bases, type_kwargs,  # type: ignore[no-any-return]
                     class_tracker_id, extra)


def _made_whole(cls: type, reduced: Any) -> Any:
    """cloudpickle's reduction of a class by value, made by `_known_or_made`, with its
    ``__slots__`` and its qualified name. It set the slots on the class it rebuilt only
    after making it, so that class's instances had a ``__dict__`` and no slots, and pickled
    their state as a dict, which the caller's own class (slotted: a
    ``dataclass(slots=True)``) could not take back ("object has no attribute
    '__dict__'"); and a nested class came back named ``Inner``, not ``Outer.Inner``, a name
    the caller's script does not have."""
    if (reduced is NotImplemented or type(reduced) is not tuple or reduced[0] is not _SKELETON
            or type(reduced[1]) is not tuple or type(reduced[1][3]) is not dict):
        return reduced
    if "__slots__" not in cls.__dict__ and cls.__qualname__ == cls.__name__:
        return (_known_or_made, *reduced[1:])
    args = list(reduced[1])
    made = dict(args[3])
    # (a typing.NamedTuple is rebuilt through its metaclass, which makes the slots itself
    # and refuses them in the class body)
    if "__slots__" in cls.__dict__ and not any(
            base is typing.NamedTuple for base in cls.__dict__.get("__orig_bases__", ())):
        made["__slots__"] = cls.__dict__["__slots__"]
    made["__qualname__"] = cls.__qualname__
    args[3] = made
    return (_known_or_made, tuple(args), *reduced[2:])


class HostFd:
    """A file descriptor of this process, reopened by a worker in the same pid namespace."""

    def __init__(self, fd: int) -> None:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
            raise ValueError(
                f"file descriptor {fd} is not a pipe or a file (a socket, or a duplex "
                f"multiprocessing.Pipe()): workers cannot reopen it; {_FIX}")
        self.pid = os.getpid()
        self.fd = fd
        self.flags = fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_APPEND)
        self.namespace = _pid_namespace()

    def detach(self) -> int:
        """Open the descriptor's pipe or file here (what the stdlib's rebuilders call)."""
        if _pid_namespace() != self.namespace:
            raise OSError(
                f"a stdlib multiprocessing object in the initializer's arguments uses a pipe "
                f"or file of process {self.pid}, which this worker cannot see (it runs on another "
                f"host, or in a container): such objects reach workers in that process's pid "
                f"namespace only, as the 'local' backend's; {_FIX}")
        return os.open(f"/proc/{self.pid}/fd/{self.fd}", self.flags | os.O_CLOEXEC)


class _Popen:
    """Stands for the stdlib's ``Popen`` of a spawned child while we pickle: the stdlib hands
    it each file descriptor to pass on, and ``DupFd`` wraps it for the child."""

    def __init__(self, dup_fd: Callable[[int], Any]) -> None:
        self.DupFd = dup_fd  # the stdlib's name for it

    @staticmethod
    def duplicate_for_child(fd: int) -> int:
        return fd


@contextlib.contextmanager
def spawning(dup_fd: Callable[[int], Any]) -> Iterator[None]:
    """While inside, on this thread: the stdlib pickles its objects as for a spawned child,
    each file descriptor wrapped by ``dup_fd`` (`HostFd`, or the stdlib's
    ``resource_sharer.DupFd``)."""
    before = context.get_spawning_popen()
    context.set_spawning_popen(_Popen(dup_fd))  # type: ignore[arg-type]
    try:
        yield
    finally:
        context.set_spawning_popen(before)


def dumps(obj: Any, *, protocol: int, buffer_callback: Any = None,
          dup_fd: Callable[[int], Any] | None = None, functions_as_bytes: bool = False) -> bytes:
    """Pickle ``obj`` with `Pickler`. With ``dup_fd`` (`HostFd` for the workers this process
    starts, see the module), as for a spawned child (`spawning`); without, as the stdlib
    pickles a task: a `Connection` or socket is handed over once, by
    `multiprocessing.resource_sharer`. ``functions_as_bytes``: a function pickled by value
    goes as its kept bytes (`fiberexec._functions`). What the pickler raises propagates."""
    buffer = io.BytesIO()
    with spawning(dup_fd) if dup_fd is not None else contextlib.nullcontext():
        pickler = Pickler(buffer, protocol=protocol, buffer_callback=buffer_callback)
        pickler.functions_as_bytes = functions_as_bytes
        pickler.dump(obj)
    return buffer.getvalue()

