"""What `FiberExecutor.stats()` reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stats:
    """A snapshot of an executor's workers and tasks.

    ``throughput`` is tasks finished per second since the first submit.
    """

    workers: int  # connected and ready
    workers_starting: int
    tasks_pending: int  # submitted, not yet sent to a worker
    tasks_running: int  # sent to a worker, no result yet
    tasks_done: int  # finished with a result
    tasks_failed: int  # finished with an exception (raised, unpicklable, worker lost)
    tasks_retried: int  # re-sent after their worker died
    tasks_stolen: int  # moved from a busy shard's queue to an idle shard's
    workers_lost: int
    messages_rejected: int  # unauthenticated, malformed or oversized
    throughput: float
