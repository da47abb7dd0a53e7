"""``multiprocessing.managers`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from multiprocessing.managers import Token

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._managers import (
    AsyncManager,
    BaseManager,
    Namespace,
    SyncManager,
)
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
)
from fiberexec.multiprocessing._remote_error import RemoteError
from fiberexec.multiprocessing._shm_manager import SharedMemoryManager

__all__ = [
    "AcquirerProxy",
    "ArrayProxy",
    "AsyncManager",
    "AsyncProxy",
    "BarrierProxy",
    "BaseManager",
    "BaseProxy",
    "ConditionProxy",
    "DictProxy",
    "EventProxy",
    "IteratorProxy",
    "ListProxy",
    "Namespace",
    "NamespaceProxy",
    "PoolProxy",
    "RemoteError",
    "SharedMemoryManager",
    "SyncManager",
    "Token",
    "ValueProxy",
]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
