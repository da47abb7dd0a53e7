"""``multiprocessing.queues`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from fiberexec.multiprocessing._queues import JoinableQueue, Queue, SimpleQueue

__all__ = ["JoinableQueue", "Queue", "SimpleQueue"]
