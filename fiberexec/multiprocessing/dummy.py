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

__all__ = ["Barrier", "BoundedSemaphore", "Condition", "Event", "JoinableQueue", "Lock",
           "Manager", "Pipe", "Pool", "Process", "Queue", "RLock", "Semaphore",
           "active_children", "current_process", "freeze_support"]
