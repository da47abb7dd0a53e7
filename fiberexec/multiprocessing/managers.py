"""``multiprocessing.managers`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

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
    ListProxy,
    NamespaceProxy,
    ValueProxy,
)

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
    "ListProxy",
    "Namespace",
    "NamespaceProxy",
    "SyncManager",
    "ValueProxy",
]
