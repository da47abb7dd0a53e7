"""A drop-in for the `multiprocessing` API whose processes are local processes, containers
or pods: ``import fiberexec.multiprocessing as mp``.

`Pool` runs on `FiberExecutor`; `Process`, queues, pipes, locks, shared values and managers
run on the same backends through the backend seam, over authenticated connections. Start
methods (`get_context`, `set_start_method`) are accepted by name and change nothing: every
process is a fresh interpreter. See the README for what each name does on each backend.
"""

from __future__ import annotations

import importlib
from multiprocessing import reducer
from typing import TYPE_CHECKING, Any

from fiberexec.multiprocessing._backends import meta, set_default_backend
from fiberexec.multiprocessing._connection import Connection, Pipe
from fiberexec.multiprocessing._context import (
    BaseContext,
    get_all_start_methods,
    get_context,
    get_start_method,
    set_start_method,
)
from fiberexec.multiprocessing._context import _default as _default_context
from fiberexec.multiprocessing._errors import (
    AuthenticationError,
    BufferTooShort,
    ProcessError,
    TimeoutError,
)
from fiberexec.multiprocessing._meta import cpu_count
from fiberexec.multiprocessing._process import (
    Process,
    active_children,
    current_process,
    parent_process,
)
from fiberexec.multiprocessing._proxies import AsyncProxy, BaseProxy
from fiberexec.multiprocessing._queues import JoinableQueue, Queue, SimpleQueue
from fiberexec.multiprocessing._sharedctypes import Array, RawArray, RawValue, Value
from fiberexec.multiprocessing._sync import (
    Barrier,
    BoundedSemaphore,
    BrokenBarrierError,
    Condition,
    Event,
    Lock,
    RLock,
    Semaphore,
)

freeze_support = _default_context.freeze_support
get_logger = _default_context.get_logger
log_to_stderr = _default_context.log_to_stderr
allow_connection_pickling = _default_context.allow_connection_pickling
set_executable = _default_context.set_executable
set_forkserver_preload = _default_context.set_forkserver_preload

# logging levels of multiprocessing's own (`log_to_stderr(SUBDEBUG)`), as the stdlib's has them
SUBDEBUG, SUBWARNING = 5, 25

if TYPE_CHECKING:
    from fiberexec.multiprocessing._managers import (
        AsyncManager,
        BaseManager,
        Manager,
        SyncManager,
    )
    from fiberexec.multiprocessing._pool import (
        ApplyResult,
        AsyncResult,
        IMapIterator,
        MapResult,
        Pool,
    )
    from fiberexec.multiprocessing._remote_error import RemoteError

# The pool and the managers (and the executor the pool runs on), and the managers' error,
# are imported on first use, as the standard library's are: a program of processes and
# queues does not wait for them.
_LAZY = {name: "_pool" for name in ("ApplyResult", "AsyncResult", "IMapIterator", "MapResult",
                                   "Pool")} | {
    name: "_managers" for name in ("AsyncManager", "BaseManager", "Manager", "SyncManager")} | {
    "RemoteError": "_remote_error"}

# The stdlib's submodules, each with the same names (ours where we have our own, the
# stdlib's where nothing is process-specific); imported on first use, as attributes too.
_SUBMODULES = frozenset({"connection", "context", "dummy", "managers", "pool", "process",
                         "queues", "reduction", "shared_memory", "sharedctypes",
                         "synchronize", "util"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every name, those imported on first use too (as ``dir(multiprocessing)`` lists them)."""
    return sorted({*globals(), *_LAZY, *_SUBMODULES})


__all__ = [
    "ApplyResult",
    "Array",
    "AsyncManager",
    "AsyncProxy",
    "AsyncResult",
    "AuthenticationError",
    "Barrier",
    "BaseContext",
    "BaseManager",
    "BaseProxy",
    "BoundedSemaphore",
    "BrokenBarrierError",
    "BufferTooShort",
    "Condition",
    "Connection",
    "Event",
    "IMapIterator",
    "JoinableQueue",
    "Lock",
    "Manager",
    "MapResult",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "Queue",
    "RLock",
    "RawArray",
    "RawValue",
    "RemoteError",
    "Semaphore",
    "SimpleQueue",
    "SyncManager",
    "TimeoutError",
    "Value",
    "active_children",
    "allow_connection_pickling",
    "cpu_count",
    "current_process",
    "freeze_support",
    "get_all_start_methods",
    "get_context",
    "get_logger",
    "get_start_method",
    "log_to_stderr",
    "meta",
    "parent_process",
    "reducer",
    "set_default_backend",
    "set_executable",
    "set_forkserver_preload",
    "set_start_method",
]
