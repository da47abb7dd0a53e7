"""``multiprocessing.synchronize`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._sync import (
    Barrier,
    BoundedSemaphore,
    Condition,
    Event,
    Lock,
    RLock,
    Semaphore,
)

__all__ = ["Barrier", "BoundedSemaphore", "Condition", "Event", "Lock", "RLock", "Semaphore"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
