"""What the dashboard reads (a `Source`: the executor, or a fake in tests) and the JSON it serves.

Every record is turned into plain JSON data here, once per request; the page and the
Prometheus collector never see the records themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from fiberexec._observe import Durations, FailureInfo, TaskSpan, WorkerInfo
from fiberexec._stats import Stats

# The newest spans a response carries: at tens of thousands of tasks a second the page
# draws the latest of the stream, not every task (the response says that some were left
# out). Each span costs the executor's process a record and its JSON while a flood runs:
# 1000 keep a refresh (once a second) to ~11 ms of its time, 2000 took ~22 ms: the no-op
# submit rate with the page open fell 5% below the rate without it.
MAX_SPANS = 1000
FAILURES = 20


class Source(Protocol):
    """The executor as the dashboard sees it (`FiberExecutor` has these methods)."""

    def workers(self) -> list[WorkerInfo]: ...

    def task_spans(self, since: float = 0.0, limit: int | None = None) -> list[TaskSpan]: ...

    def task_durations(self) -> Durations: ...

    def failures(self, limit: int = 20) -> list[FailureInfo]: ...

    def dump_stack(self, worker_id: str, timeout: float = 5.0) -> str: ...

    def stats(self) -> Stats: ...


# Workers and spans travel as rows (lists) under these column names, times rounded to the
# millisecond: a thousand workers a second cost a third of what objects would.
COLUMNS = {
    "workers": ("id", "backend", "reference", "host", "state", "done", "failed", "cpu", "rss",
                "heard", "task", "ended"),
    "task": ("id", "function", "arguments", "started"),
    "spans": ("task", "worker", "function", "started", "ended", "ok"),
}


def state(source: Source, since: float, now: float) -> dict[str, Any]:
    """Everything the page draws in one refresh: spans are those that ended after ``since``."""
    spans = source.task_spans(since, MAX_SPANS + 1)  # one more says that some were left out
    return {
        "now": now,
        "columns": COLUMNS,
        "stats": dataclasses.asdict(source.stats()),
        "workers": [worker(w) for w in source.workers()],
        "spans": [span(s) for s in spans[-MAX_SPANS:]],
        "spans_left_out": len(spans) > MAX_SPANS,
        "failures": [failure(f) for f in reversed(source.failures(FAILURES))],  # newest first
    }


def _ms(when: float | None) -> float | None:
    return None if when is None else round(when, 3)


def worker(w: WorkerInfo) -> list[Any]:
    task = w.task
    return [w.worker_id, w.backend, w.reference, w.host, w.state, w.tasks_done, w.tasks_failed,
            w.cpu_percent, w.rss_bytes, _ms(w.last_heard),
            None if task is None else
            [task.task_id, task.function, task.arguments, _ms(task.started)], w.ended]


def span(s: TaskSpan) -> list[Any]:
    return [s.task_id, s.worker_id, s.function, _ms(s.started), _ms(s.ended), s.ok]


def failure(f: FailureInfo) -> dict[str, Any]:
    return {"task": f.task_id, "worker": f.worker_id, "function": f.function,
            "arguments": f.arguments, "error": f.error, "traceback": f.traceback,
            "when": f.when}
