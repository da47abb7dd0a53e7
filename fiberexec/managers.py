"""Fiber's ``fiber.managers``: `AsyncManager` (calls return `AsyncHandle`s, which are also
futures), and the standard managers of `fiberexec.multiprocessing.managers`."""

from __future__ import annotations

from fiberexec._fiber_managers import AsyncHandle, AsyncManager, HandleProxy
from fiberexec.multiprocessing.managers import BaseManager, BaseProxy, SyncManager

__all__ = ["AsyncHandle", "AsyncManager", "BaseManager", "BaseProxy", "HandleProxy",
           "SyncManager"]
