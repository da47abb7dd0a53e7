"""Prometheus ``/metrics``: scraped over real HTTP from a real executor and parsed with
prometheus_client's own parser; every finished task counted once in the duration histogram."""

from __future__ import annotations

import concurrent.futures
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fiberexec._dashboard.metrics import histogram
from fiberexec._observe import SPANS_MAX, Durations
from tests.conftest import ExecutorFactory
from tests.dashboard import dashboard_tasks
from tests.dashboard.conftest import request


def _scrape(url: str, token: str) -> dict[str, Any]:
    """Each sample's value by name and labels: ``values["x_total"]``, ``values["y", "l=v"]``."""
    bearer = {"Authorization": f"Bearer {token}"} if token else {}  # else ?token= in url
    reply = request(url, headers={**bearer, "Accept": "text/plain"})
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    values: dict[Any, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[(sample.name, labels) if labels else sample.name] = sample.value
    return values


def _run(ex: Any, ok: int, failing: int) -> None:
    futures = [ex.submit(dashboard_tasks.brief, 0.001) for _ in range(ok)]
    futures += [ex.submit(dashboard_tasks.fail_with, f"no {i}") for i in range(failing)]
    concurrent.futures.wait(futures, timeout=120)
    assert sum(f.exception(0) is None for f in futures) == ok


def test_metrics_count_the_work_a_real_executor_did(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, dashboard=True)
    _run(ex, ok=20, failing=3)
    url, _, token = (ex.dashboard_url or "").partition("?token=")
    assert request(url + "metrics").status == 403
    values = _scrape(url + "metrics", token)
    assert values["fiberexec_tasks_done_total"] == 20
    assert values["fiberexec_tasks_failed_total"] == 3
    assert values["fiberexec_tasks_submitted_total"] == 23
    assert values["fiberexec_tasks_retried_total"] == values["fiberexec_workers_lost_total"] == 0
    stats = ex.stats()  # the links carried 23 tasks and their results (and heartbeats since)
    assert 23 * 10 < values["fiberexec_bytes_sent_total"] <= stats.bytes_sent
    assert 23 * 10 < values["fiberexec_bytes_received_total"] <= stats.bytes_received
    assert values["fiberexec_tasks_pending"] == values["fiberexec_tasks_running"] == 0
    live = values["fiberexec_workers", "state=idle"] + values["fiberexec_workers", "state=running"]
    assert live + values["fiberexec_workers", "state=starting"] == 2
    assert values["fiberexec_workers", "state=lost"] == 0
    assert values["fiberexec_task_duration_seconds_count"] == 23
    assert values["fiberexec_task_duration_seconds_bucket", "le=+Inf"] == 23
    # brief(0.001) sleeps past 1 ms: only the failures (microseconds) can be under it
    assert values["fiberexec_task_duration_seconds_bucket", "le=0.001"] <= 3
    assert 20 * 0.001 <= values["fiberexec_task_duration_seconds_sum"] < 60

    again = _scrape(url + "metrics", token)  # nothing new: nothing counted twice
    assert again["fiberexec_task_duration_seconds_count"] == 23
    _run(ex, ok=5, failing=0)
    later = _scrape(f"{url}metrics?token={token}", "")
    assert later["fiberexec_tasks_done_total"] == 25
    assert later["fiberexec_task_duration_seconds_count"] == 28


def test_a_scraper_asking_for_openmetrics_gets_it(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, dashboard=True)
    _run(ex, ok=2, failing=0)
    url, _, token = (ex.dashboard_url or "").partition("?token=")
    reply = request(url + "metrics", headers={
        "Authorization": f"Bearer {token}",
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    text = reply.body.decode()
    assert text.endswith("# EOF\n") and "fiberexec_tasks_done_total 2.0" in text


def test_the_histogram_counts_every_task_not_only_the_spans_kept(
        make_executor: ExecutorFactory) -> None:
    # A shard keeps its newest SPANS_MAX spans for the task stream; the histogram must not
    # be read from them, or a flood between two scrapes would be counted as that many.
    n = SPANS_MAX + 2500
    ex = make_executor(2, dashboard=True)
    concurrent.futures.wait([ex.submit(dashboard_tasks.brief, 0) for _ in range(n)],
                            timeout=300)
    assert len(ex.task_spans()) < n  # the stream has left some out
    url, _, token = (ex.dashboard_url or "").partition("?token=")
    values = _scrape(url + "metrics", token)
    assert values["fiberexec_tasks_done_total"] == n
    assert values["fiberexec_task_duration_seconds_count"] == n
    assert values["fiberexec_task_duration_seconds_bucket", "le=+Inf"] == n
    assert ex.task_durations().count == n


def test_buckets_are_cumulative_with_inf_last() -> None:
    durations = Durations((0.1, 1.0, float("inf")), (3, 1, 1), 5.65)
    assert histogram(durations) == [("0.1", 3.0), ("1.0", 4.0), ("+Inf", 5.0)]
    assert durations.count == 5
