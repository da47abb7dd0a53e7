"""Fiber's queue names over `fiberexec.multiprocessing`'s queues."""

from __future__ import annotations

from fiberexec.multiprocessing import SimpleQueue

#: Fiber's name for its push-based `SimpleQueue` (messages flow to the reader without being
#: asked for): fiberexec's one `SimpleQueue` already does that.
SimpleQueuePush = SimpleQueue

__all__ = ["SimpleQueuePush"]
