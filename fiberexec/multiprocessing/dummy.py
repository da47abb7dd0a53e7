"""``multiprocessing.dummy`` for ``fiberexec.multiprocessing``: the stdlib's own, the same
API on threads of this process (nothing to distribute)."""

from __future__ import annotations

from multiprocessing.dummy import (
    Barrier,
    BoundedSemaphore,
    Condition,
    Event,
    JoinableQueue,
    Lock,
    Manager,
    Pipe,
    Pool,
    Process,
    Queue,
    RLock,
    Semaphore,
    active_children,
    current_process,
    freeze_support,
)

from fiberexec.multiprocessing import _stdnames

__all__ = ["Barrier", "BoundedSemaphore", "Condition", "Event", "JoinableQueue", "Lock",
           "Manager", "Pipe", "Pool", "Process", "Queue", "RLock", "Semaphore",
           "active_children", "current_process", "freeze_support"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
