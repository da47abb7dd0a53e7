"""An in-memory `Source` (the dashboard's seam to the executor), for the server's own tests."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from fiberexec._observe import (
    DURATION_BOUNDS,
    Durations,
    FailureInfo,
    TaskInfo,
    TaskSpan,
    WorkerInfo,
)
from fiberexec._stats import Stats


@dataclass
class FakeSource:
    """Whatever a test puts in it; records what was asked."""

    worker_list: list[WorkerInfo] = field(default_factory=list)
    spans: list[TaskSpan] = field(default_factory=list)
    failure_list: list[FailureInfo] = field(default_factory=list)
    stacks: dict[str, str] = field(default_factory=dict)
    durations: Durations = field(default_factory=lambda: Durations(
        DURATION_BOUNDS, (0,) * len(DURATION_BOUNDS), 0.0))
    numbers: Stats = field(default_factory=lambda: Stats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0))
    stack_error: Exception | None = None
    asked_since: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def workers(self) -> list[WorkerInfo]:
        return list(self.worker_list)

    def task_spans(self, since: float = 0.0, limit: int | None = None) -> list[TaskSpan]:
        with self.lock:
            self.asked_since.append(since)
        found = [s for s in self.spans if s.ended > since]
        return found if limit is None else found[max(0, len(found) - limit):]

    def task_durations(self) -> Durations:
        return self.durations

    def failures(self, limit: int = 20) -> list[FailureInfo]:
        return self.failure_list[-limit:]  # oldest first, as the executor gives them

    def dump_stack(self, worker_id: str, timeout: float = 5.0) -> str:
        if self.stack_error is not None:
            raise self.stack_error
        if worker_id not in self.stacks:  # as the executor says it
            raise LookupError(f"no worker {worker_id!r} in this source")
        return self.stacks[worker_id]

    def stats(self) -> Stats:
        return self.numbers


def worker(n: int, state: str = "idle", *, function: str | None = None,
           running_for: float = 0.0, now: float | None = None) -> WorkerInfo:
    """Worker ``w<n>``; running ``function`` for ``running_for`` seconds when given one."""
    now = time.time() if now is None else now
    task = None if function is None else TaskInfo(n, function, f"{n}", now - running_for)
    return WorkerInfo(f"w{n}", "local", f"pid {1000 + n}", f"host{n % 4}", state, task,
                      tasks_done=n, tasks_failed=n % 3, cpu_percent=12.5, rss_bytes=50 << 20,
                      last_heard=now - 0.2)


def span(n: int, worker_id: str, function: str, ended: float, seconds: float = 0.01, *,
         ok: bool = True) -> TaskSpan:
    return TaskSpan(n, worker_id, function, ended - seconds, ended, ok)


def busy_source(workers: int, now: float | None = None) -> FakeSource:
    """``workers`` workers, most running, one straggling and one lost, with a stream of spans
    over the last minute and a few failures."""
    now = time.time() if now is None else now
    fns = ("model.simulate", "model.evaluate", "model.fit")
    source = FakeSource()
    for n in range(workers):
        state = "lost" if n == 1 else "idle" if n % 7 == 6 else "running"
        function = fns[n % 3] if state == "running" else None
        running_for = 300.0 if n == 0 else 0.5 * (n % 10)  # w0 straggles: tasks take ~17 s
        source.worker_list.append(worker(n, state, function=function, running_for=running_for,
                                         now=now))
    for i in range(4000):
        ended = now - 59 + 59 * i / 4000
        source.spans.append(span(i, f"w{i % workers}", fns[i % 3], ended, 15.0 + (i % 5),
                                 ok=i % 97 != 0))
    source.failure_list = [
        FailureInfo(i, f"w{i}", "model.evaluate", f"{i}", f"ValueError: bad input {i}",
                    f"Traceback (most recent call last):\n  File \"model.py\", line {i}, in "
                    f"evaluate\nValueError: bad input {i}\n", now - i)
        for i in reversed(range(5))
    ]
    source.numbers = Stats(workers - 1, 0, 250, workers - workers // 7 - 1, 40000, 41, 3, 0, 1,
                           0, 700.0)
    return source
