"""Prometheus metrics of one executor: a collector over its `Source`, in a registry of its own.

Counters, gauges and the task duration histogram are read from `Stats`, `workers()` and
`task_durations()` at each scrape: the executor counts every finished task's run time as it
records it, so the histogram holds every task, however many ended between two scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from fiberexec._dashboard.source import Source
from fiberexec._observe import Durations

# A worker's states, as `WorkerInfo.state` has them: each is exported, at 0 when none is in it.
STATES = ("starting", "idle", "running", "lost", "retired")


def histogram(durations: Durations) -> list[tuple[str, float]]:
    """``(le, count)`` pairs, cumulative, as the exposition format has them (``+Inf`` last)."""
    pairs, running = [], 0
    for bound, count in zip(durations.bounds, durations.counts, strict=True):
        running += count
        pairs.append(("+Inf" if math.isinf(bound) else repr(bound), float(running)))
    return pairs


class ExecutorCollector(Collector):
    """The executor's metrics, read from its `Source` at each scrape."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        stats = self.source.stats()
        durations = self.source.task_durations()
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
        for name, doc, value in (
            ("tasks_submitted", "Tasks submitted (cancelled ones too).", stats.tasks_submitted),
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
        yield HistogramMetricFamily(
            "fiberexec_task_duration_seconds", "Time from a task's start on a worker to its end.",
            buckets=histogram(durations), sum_value=durations.total,
        )


def registry(source: Source) -> CollectorRegistry:
    """A registry of this executor's metrics alone (never the process-wide default one)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(ExecutorCollector(source))
    return found
