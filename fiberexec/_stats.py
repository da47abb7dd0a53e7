"""What `FiberExecutor.stats()` reports."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


def rounded_repr(record: Any) -> str:
    """A dataclass record as ``Name(field=value, ...)``, each float rounded (`_short`):
    what a user prints reads at a glance; the attributes keep every digit."""
    shown = ", ".join(f"{f.name}={_short(getattr(record, f.name))}" for f in fields(record))
    return f"{type(record).__name__}({shown})"


@dataclass(frozen=True, repr=False)  # rounded_repr rounds the rate
class Stats:
    """A snapshot of an executor's workers and tasks.

    ``throughput`` is tasks finished per second since the first submit; its repr is rounded
    (the attribute keeps every digit).
    """

    workers: int  # connected and ready (past the initializer)
    workers_starting: int
    tasks_pending: int  # submitted, not yet started (queued, or held at a worker behind one)
    tasks_running: int  # started at a worker (or next to start there), no result yet
    tasks_done: int  # finished with a result (a chunked map's items count one by one)
    tasks_failed: int  # finished with an exception (raised, unpicklable, worker lost)
    tasks_retried: int  # re-sent after their worker died (run there, or only held there)
    tasks_stolen: int  # moved from a busy shard's queue to an idle shard's
    workers_lost: int
    messages_rejected: int  # unauthenticated, malformed or oversized
    throughput: float
    args_kept_bytes: int = 0  # large arguments sent to workers that keep them (arg_cache)
    args_saved_bytes: int = 0  # large arguments not sent: the worker kept them (per send)
    bytes_sent: int = 0  # to workers, over their links (shared-memory payloads not counted)
    bytes_received: int = 0  # from workers, likewise
    tasks_submitted: int = 0  # every task (map item) submitted: the five above, and cancelled

    __repr__ = rounded_repr


def _short(value: object) -> str:
    """A count as it is; a float (a rate, a time) to one decimal, or three significant
    digits below 10."""
    if not isinstance(value, float):
        return repr(value)
    return repr(round(value, 1) if abs(value) >= 10 else float(f"{value:.3g}"))
