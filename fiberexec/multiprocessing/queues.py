"""``multiprocessing.queues`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._queues import JoinableQueue, Queue, SimpleQueue

__all__ = ["JoinableQueue", "Queue", "SimpleQueue"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
