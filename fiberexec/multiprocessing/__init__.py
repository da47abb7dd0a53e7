"""A drop-in for the `multiprocessing` API whose processes are local processes, containers
or pods: ``import fiberexec.multiprocessing as mp``.

`Pool` runs on `FiberExecutor`; `Process`, queues, pipes and managers run on the same
backends through the backend seam, over authenticated pynng connections.
"""

from __future__ import annotations

from fiberexec.multiprocessing._backends import meta, set_default_backend
from fiberexec.multiprocessing._connection import Connection, Pipe
from fiberexec.multiprocessing._errors import (
    AuthenticationError,
    BufferTooShort,
    ProcessError,
    RemoteError,
    TimeoutError,
)
from fiberexec.multiprocessing._managers import (
    AsyncManager,
    AsyncProxy,
    BaseProxy,
    Manager,
    SyncManager,
)
from fiberexec.multiprocessing._meta import cpu_count
from fiberexec.multiprocessing._pool import ApplyResult, AsyncResult, IMapIterator, MapResult, Pool
from fiberexec.multiprocessing._process import (
    Process,
    active_children,
    current_process,
    parent_process,
)
from fiberexec.multiprocessing._queues import JoinableQueue, Queue, SimpleQueue

__all__ = [
    "ApplyResult",
    "AsyncManager",
    "AsyncProxy",
    "AsyncResult",
    "AuthenticationError",
    "BaseProxy",
    "BufferTooShort",
    "Connection",
    "IMapIterator",
    "JoinableQueue",
    "Manager",
    "MapResult",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "Queue",
    "RemoteError",
    "SimpleQueue",
    "SyncManager",
    "TimeoutError",
    "active_children",
    "cpu_count",
    "current_process",
    "meta",
    "parent_process",
    "set_default_backend",
]
