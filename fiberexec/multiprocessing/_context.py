"""Contexts: `get_context`, `get_start_method`, `set_start_method`, `get_all_start_methods`.

Libraries written for `multiprocessing` take a start-method name and use the context's
attributes (``ctx.Process``, ``ctx.Pipe``, ``ctx.Array`` ...). Every context here has the
same attributes as the module. The method names of the standard library are accepted and
remembered, but select nothing different: a process always starts as a fresh interpreter
(a local process, a container or a pod) that imports what it runs, which is what ``spawn``
means; nothing is forked, so ``fork`` and ``forkserver`` behave as ``spawn`` does.

The method ``fiber`` names these contexts in the standard library too
(``multiprocessing.get_context("fiber")``, see `fiberexec._start_method`): its context is
registered there when this module is imported.
"""

from __future__ import annotations

import multiprocessing as _std
import multiprocessing.util as _util
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from fiberexec import _start_method
from fiberexec.backend import ENV_PRELOAD
from fiberexec.multiprocessing import (
    _errors,
    _hostpipe,
    _meta,
    _process,
    _queues,
    _sharedctypes,
    _sync,
)
from fiberexec.multiprocessing._connection import Connection
from fiberexec.multiprocessing._connection import Pipe as _Pipe

METHODS = ("spawn", "fork", "forkserver", _start_method.NAME)
DEFAULT_METHOD = "spawn"


class BaseContext(_start_method._StdContext):
    """The `multiprocessing` API as attributes, like the standard library's contexts; at
    run time a subclass of theirs (every attribute of it is defined here)."""

    ProcessError = _errors.ProcessError
    BufferTooShort = _errors.BufferTooShort
    TimeoutError = _errors.TimeoutError
    AuthenticationError = _errors.AuthenticationError
    Process = _process.Process
    current_process = staticmethod(_process.current_process)
    parent_process = staticmethod(_process.parent_process)
    active_children = staticmethod(_process.active_children)
    cpu_count = staticmethod(_meta.cpu_count)
    reducer = _std.reducer

    _name: str | None = None

    def get_context(self, method: str | None = None) -> BaseContext:
        return get_context(method)

    def _check_available(self) -> None:
        """What the standard library's ``get_context`` asks of a context it hands out (as
        ``"fiber"``): every one here is available."""

    def get_start_method(self, allow_none: bool = False) -> str | None:
        return self._name

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        raise ValueError("cannot set start method of concrete context")

    def get_all_start_methods(self) -> list[str]:
        return get_all_start_methods()

    def Pipe(self, duplex: bool = True) -> tuple[Connection, Connection]:
        return _Pipe(duplex)

    def Queue(self, maxsize: int = 0) -> _queues.Queue:
        return _queues.Queue(maxsize, ctx=self)

    def JoinableQueue(self, maxsize: int = 0) -> _queues.JoinableQueue:
        return _queues.JoinableQueue(maxsize, ctx=self)

    def SimpleQueue(self) -> _queues.SimpleQueue | _hostpipe.HostSimpleQueue:
        """Where every process runs on this host, the standard library's own over this
        layer's pipe and lock (`_hostpipe.HostSimpleQueue`); otherwise one the broker
        holds."""
        from fiberexec.multiprocessing import _backends

        if _hostpipe.usable(_backends.broker_hosts()[1]):
            return _hostpipe.HostSimpleQueue(ctx=self)
        return _queues.SimpleQueue(ctx=self)

    def Lock(self) -> _sync.Lock:
        return _sync.Lock(ctx=self)

    def RLock(self) -> _sync.RLock:
        return _sync.RLock(ctx=self)

    def Condition(self, lock: Any = None) -> _sync.Condition:
        return _sync.Condition(lock, ctx=self)

    def Semaphore(self, value: int = 1) -> _sync.Semaphore:
        return _sync.Semaphore(value, ctx=self)

    def BoundedSemaphore(self, value: int = 1) -> _sync.BoundedSemaphore:
        return _sync.BoundedSemaphore(value, ctx=self)

    def Event(self) -> _sync.Event:
        return _sync.Event(ctx=self)

    def Barrier(self, parties: int, action: Callable[[], object] | None = None,
                timeout: float | None = None) -> _sync.Barrier:
        return _sync.Barrier(parties, action, timeout, ctx=self)

    def RawValue(self, typecode_or_type: Any, *args: Any) -> Any:
        return _sharedctypes.RawValue(typecode_or_type, *args)

    def RawArray(self, typecode_or_type: Any, size_or_initializer: Any) -> Any:
        return _sharedctypes.RawArray(typecode_or_type, size_or_initializer)

    def Value(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> Any:
        return _sharedctypes.Value(typecode_or_type, *args, lock=lock, ctx=self)

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, *,
              lock: Any = True) -> Any:
        return _sharedctypes.Array(typecode_or_type, size_or_initializer, lock=lock, ctx=self)

    def Manager(self) -> Any:
        from fiberexec.multiprocessing._managers import Manager

        return Manager()

    def Pool(self, processes: int | None = None,
             initializer: Callable[..., object] | None = None, initargs: Iterable[Any] = (),
             maxtasksperchild: int | None = None, **options: Any) -> Any:
        """``options``: the pool's own (``backend=``, `FiberExecutor`'s keywords, Fiber's
        ``error_handling=``), as `Pool` takes them."""
        from fiberexec.multiprocessing._pool import Pool

        return Pool(processes, initializer, initargs, maxtasksperchild, context=self, **options)

    def freeze_support(self) -> None:
        """Nothing to do: processes never start from a frozen executable's own copy."""

    def get_logger(self) -> Any:
        return _util.get_logger()

    def log_to_stderr(self, level: int | None = None) -> Any:
        return _util.log_to_stderr(level)

    def allow_connection_pickling(self) -> None:
        """Nothing to do: connections always pickle."""

    def set_executable(self, executable: str) -> None:
        """Accepted for compatibility; the backend decides the interpreter (``python=``)."""

    def set_forkserver_preload(self, module_names: list[str]) -> None:
        """Modules the worker launcher imports before it forks processes, as the stdlib's
        fork server does, so each starts with them: this sets ``FIBEREXEC_PRELOAD``, which
        the local and ssh backends' launchers read (a launcher started before keeps what it
        has; backends that start each process afresh have none). An empty list preloads
        nothing. A module the launcher cannot import is skipped."""
        if isinstance(module_names, str) or not all(
                type(name) is str for name in module_names):
            raise TypeError(f"set_forkserver_preload takes a list of module names (str), got "
                            f"{module_names!r}; pass, say, ['numpy']")
        if module_names:
            os.environ[ENV_PRELOAD] = ",".join(module_names)
        else:
            os.environ.pop(ENV_PRELOAD, None)

    def __repr__(self) -> str:
        return f"<fiberexec.multiprocessing context {self._name!r}>"


class Context(BaseContext):
    """A context for one start method name (all behave alike; see the module docstring),
    whose ``Process`` is named after it, as the standard library's (``SpawnProcess-1``)."""

    def __init__(self, method: str) -> None:
        self._name = method
        self.Process = _process.BY_METHOD[method]


class DefaultContext(BaseContext):
    """The module's own context: its start method can be set once."""

    def __init__(self) -> None:
        self._actual: str | None = None
        self._lock = threading.Lock()

    def get_start_method(self, allow_none: bool = False) -> str | None:
        with self._lock:
            if self._actual is None and not allow_none:
                self._actual = DEFAULT_METHOD
            return self._actual

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        with self._lock:
            if self._actual is not None and not force:
                raise RuntimeError("context has already been set")
            if method is not None:
                _check(method)
            self._actual = method

    @property
    def _name(self) -> str | None:  # type: ignore[override]
        return self.get_start_method()


def _check(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"cannot find context for {method!r}")


_contexts = {name: Context(name) for name in METHODS}
_default = DefaultContext()
_start_method.register(_contexts[_start_method.NAME])


def get_context(method: str | None = None) -> BaseContext:
    """A context whose attributes are this module's API.

    Args:
        method: ``"spawn"``, ``"fork"``, ``"forkserver"`` or ``"fiber"`` (None: the default
            context). Every method starts processes the same way (fresh interpreters); the
            name is accepted so code written for the standard library runs unchanged.

    Raises:
        ValueError: an unknown method name.

    Example:
        >>> ctx = get_context("spawn")
        >>> ctx.get_start_method()
        'spawn'
    """
    if method is None:
        return _default
    _check(method)
    return _contexts[method]


def get_start_method(allow_none: bool = False) -> str | None:
    """The default context's start method (``"spawn"`` unless set)."""
    return _default.get_start_method(allow_none)


def set_start_method(method: str | None, force: bool = False) -> None:
    """Set the default start method once (``force=True`` to change it); nothing else changes."""
    _default.set_start_method(method, force)


def get_all_start_methods() -> list[str]:
    """The accepted method names, the default first."""
    return list(METHODS)
