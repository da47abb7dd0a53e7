"""Prometheus metrics of one executor: a collector over its `Source`, in a registry of its own.

Counters and gauges are read from `Stats` and `workers()` at each scrape. The task duration
histogram is cumulative across scrapes: each scrape reads the spans that ended since the
previous one (with a short overlap, as a span is recorded just after it ends) and counts each
span once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from fiberexec._dashboard.source import Source
from fiberexec._observe import TaskSpan

# A worker's states, as `WorkerInfo.state` has them: each is exported, at 0 when none is in it.
STATES = ("starting", "idle", "running", "lost", "retired")
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0, 60.0, 300.0, math.inf)
OVERLAP = 2.0  # seconds: how late after its end a span may still be recorded


class SpanTally:
    """A cumulative histogram of span durations that counts each span once, though spans are
    read in overlapping windows (`since` gives the next window's start)."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # per bucket, not cumulative
        self.total = 0.0
        # span (task, worker) -> its end; not its times, which the executor derives anew at
        # each read (its clock against the wall clock) and may differ by microseconds
        self._seen: dict[tuple[int, str], float] = {}
        self._latest = 0.0
        self._lock = threading.Lock()  # two scrapes at once must not count a span twice

    def since(self) -> float:
        return max(0.0, self._latest - OVERLAP)

    def add(self, spans: Iterable[TaskSpan]) -> None:
        with self._lock:
            for s in spans:
                key = (s.task_id, s.worker_id)
                if key in self._seen:
                    continue
                self._seen[key] = s.ended
                self._latest = max(self._latest, s.ended)
                self._count(max(0.0, s.ended - s.started))
            horizon = self.since()
            self._seen = {k: end for k, end in self._seen.items() if end >= horizon}

    def _count(self, seconds: float) -> None:
        self.total += seconds
        for i, bound in enumerate(self.buckets):
            if seconds <= bound:
                self.counts[i] += 1
                return

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """``(le, count)`` pairs as the exposition format has them (``+Inf`` last), and the sum."""
        with self._lock:
            running, pairs = 0, []
            for bound, count in zip(self.buckets, self.counts, strict=True):
                running += count
                pairs.append(("+Inf" if math.isinf(bound) else repr(bound), float(running)))
            return pairs, self.total


class ExecutorCollector(Collector):
    """The executor's metrics, read from its `Source` at each scrape."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.durations = SpanTally()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        stats = self.source.stats()
        self.durations.add(self.source.task_spans(self.durations.since()))
        states = dict.fromkeys(STATES, 0)
        for w in self.source.workers():
            states[w.state] = states.get(w.state, 0) + 1
        workers = GaugeMetricFamily("fiberexec_workers", "Workers by state.", labels=["state"])
        for state, count in states.items():
            workers.add_metric([state], count)
        yield workers
        yield GaugeMetricFamily("fiberexec_tasks_pending",
                                "Tasks submitted, not yet sent to a worker (queue depth).",
                                value=stats.tasks_pending)
        yield GaugeMetricFamily("fiberexec_tasks_running",
                                "Tasks sent to a worker, no result yet.", value=stats.tasks_running)
        submitted = (stats.tasks_pending + stats.tasks_running + stats.tasks_done
                     + stats.tasks_failed)
        for name, doc, value in (
            ("tasks_submitted", "Tasks submitted.", submitted),
            ("tasks_done", "Tasks finished with a result.", stats.tasks_done),
            ("tasks_failed", "Tasks finished with an exception.", stats.tasks_failed),
            ("tasks_retried", "Tasks sent again after their worker died.", stats.tasks_retried),
            ("workers_lost", "Workers that died or went silent.", stats.workers_lost),
            ("messages_rejected", "Unauthenticated, malformed or oversized messages.",
             stats.messages_rejected),
            ("bytes_sent", "Bytes sent to workers over their links.", stats.bytes_sent),
            ("bytes_received", "Bytes received from workers over their links.",
             stats.bytes_received),
        ):
            yield CounterMetricFamily(f"fiberexec_{name}", doc, value=value)
        buckets, total = self.durations.snapshot()
        yield HistogramMetricFamily(
            "fiberexec_task_duration_seconds", "Time from a task's start on a worker to its end.",
            buckets=buckets, sum_value=total,
        )


def registry(source: Source) -> CollectorRegistry:
    """A registry of this executor's metrics alone (never the process-wide default one)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(ExecutorCollector(source))
    return found
