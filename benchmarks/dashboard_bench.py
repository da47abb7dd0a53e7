"""What the dashboard costs the executor: no-op submit throughput and round trip, off and on.

    python -m benchmarks.dashboard_bench              # 5 runs of each, alternated
    python -m benchmarks.dashboard_bench --quick      # 3 runs of each, smaller sizes
    python -m benchmarks.dashboard_bench --measure idle --mode quick   # one run: on, unpolled

Each run is a fresh process (`benchmarks.fresh`) with a 2-worker `FiberExecutor`, either
without a dashboard or with one and a client process that does what an open page and a
Prometheus server do: ``GET /api/state`` (the page's whole refresh) once a second and
``GET /metrics`` every 15 s, with the token, over real HTTP on a kept-alive connection. The
runs alternate off/on, so a noisy moment hits both; the result is each setting's median and
the ratio on/off, written to
``benchmarks/dashboard.json`` and, as the table docs/dashboard.md shows,
``benchmarks/dashboard.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import wait
from pathlib import Path
from typing import Any

from benchmarks import tasks
from benchmarks.measure import MARKER
from benchmarks.workloads import percentile

WORKERS = 2
TIMEOUT = 300.0
POLL = 1.0  # seconds between the page's requests, as the page polls
SCRAPE = 15  # polls between two of /metrics (Prometheus' default scrape_interval: 15 s)
# Long enough that every run spans several of the client's polls.
SIZES = {"full": {"submit_n": 100_000, "latency_n": 10_000, "warmup": 500, "repeat": 5},
         "quick": {"submit_n": 20_000, "latency_n": 3000, "warmup": 200, "repeat": 3}}
DASHBOARD_THREAD = "fiberexec-dashboard"  # the server's thread: its CPU is the dashboard's own
RESULTS = Path(__file__).with_name("dashboard.json")
TABLE = Path(__file__).with_name("dashboard.md")  # included by docs/dashboard.md


class PageClient:
    """Another process that polls the dashboard as its page and a Prometheus server would
    (in another process, as a browser is: its own work must not count as the executor's)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen[str] | None = None
        self.requests = 0
        self.seconds = 0.0  # spent waiting for answers

    def __enter__(self) -> PageClient:
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.dashboard_bench",
                                      "--client", self.url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        # Measured from its first poll on: its start (imports) is not the dashboard's cost.
        if not select.select([self.proc.stdout], [], [], TIMEOUT)[0]:
            raise TimeoutError(f"the page client made no request within {TIMEOUT:.0f} s")
        if self.proc.stdout.readline().strip() != "polling":
            raise RuntimeError("the page client failed before its first request")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        out, _ = self.proc.communicate("", timeout=TIMEOUT)  # closing stdin stops it
        found = json.loads(out.splitlines()[-1])
        self.requests, self.seconds = found["requests"], found["seconds"]


def poll(url: str) -> None:
    """The client's process: poll until stdin closes, then print what it did. Like a
    browser it keeps its connection open; ``/metrics`` is scraped as often as Prometheus
    does by default."""
    parts = urllib.parse.urlsplit(url)
    token = urllib.parse.parse_qs(parts.query)["token"][0]
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    requests, seconds, newest, rounds = 0, 0.0, 0.0, 0

    def get(path: str) -> bytes:
        nonlocal requests, seconds
        start = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        reply = conn.getresponse()
        body = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"GET {path}: {reply.status} {body[:200]!r}")
        seconds += time.perf_counter() - start
        requests += 1
        return body

    while True:
        state = json.loads(get(f"/api/state?since={max(0.0, newest - 2)}"))
        newest = max([newest, *(span[4] for span in state["spans"])])
        if rounds % SCRAPE == 0:
            get("/metrics")
        if rounds == 0:
            print("polling", flush=True)
        rounds += 1
        if select.select([sys.stdin], [], [], POLL)[0]:  # readable: closed by the parent
            break
    conn.close()
    print(json.dumps({"requests": requests, "seconds": seconds}), flush=True)


def _latency(ex: Any, n: int, warmup: int) -> list[float]:
    samples = []
    for i in range(warmup + n):
        start = time.perf_counter_ns()
        ex.submit(tasks.noop).result(timeout=TIMEOUT)
        if i >= warmup:
            samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def _throughput(ex: Any, n: int) -> float:
    start = time.perf_counter()
    _, pending = wait([ex.submit(tasks.noop) for _ in range(n)], timeout=TIMEOUT)
    if pending:
        raise TimeoutError(f"{len(pending)} of {n} tasks unfinished after {TIMEOUT}s")
    return n / (time.perf_counter() - start)


def _thread_cpu(name: str) -> float:
    """CPU seconds the threads of this process called ``name`` have used (0 if none)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            with contextlib.suppress(OSError):  # (its first field: ns on a CPU)
                stat = Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text()
                total += int(stat.split()[0]) / 1e9
    return total


def measure(setting: str, mode: str) -> dict[str, Any]:
    """One run, in this process: the executor with the dashboard ``"on"`` or ``"off"``."""
    from fiberexec import FiberExecutor

    sizes = SIZES[mode]
    with FiberExecutor(WORKERS, dashboard=setting in ("on", "idle")) as ex:
        wait([ex.submit(tasks.noop) for _ in range(8 * WORKERS)], timeout=TIMEOUT)
        url = ex.dashboard_url
        client = PageClient(url) if url and setting == "on" else None
        with client or contextlib.nullcontext():
            cpu, begin = _thread_cpu(DASHBOARD_THREAD), time.perf_counter()
            samples = _latency(ex, sizes["latency_n"], sizes["warmup"])
            rate = _throughput(ex, sizes["submit_n"])
            cpu, wall = _thread_cpu(DASHBOARD_THREAD) - cpu, time.perf_counter() - begin
    ordered = sorted(samples)
    found = {"tasks_per_s": rate, "p50_us": percentile(ordered, 50),
             "p99_us": percentile(ordered, 99)}
    if client is not None:
        found["requests"] = client.requests
        found["request_ms"] = 1000 * client.seconds / max(1, client.requests)
        found["dashboard_cpu_share"] = cpu / wall
    return found


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def compare(mode: str, repeat: int) -> dict[str, Any]:
    from benchmarks import fresh

    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(repeat):
        for setting in ("off", "on") if i % 2 == 0 else ("on", "off"):
            found = fresh.run("benchmarks.dashboard_bench", ["--measure", setting, "--mode", mode],
                              timeout=TIMEOUT)
            if "error" in found:
                raise RuntimeError(f"the {setting} run failed: {found['error']}")
            runs[setting].append(found)
            print(f"  {setting:>3}: {found}", flush=True)
    medians = {s: {k: _median(r, k) for k in ("tasks_per_s", "p50_us", "p99_us")}
               for s, r in runs.items()}
    return {
        "mode": mode, "repeat": repeat, "workers": WORKERS, "runs": runs, "medians": medians,
        "throughput_on_over_off": medians["on"]["tasks_per_s"] / medians["off"]["tasks_per_s"],
        "p50_on_over_off": medians["on"]["p50_us"] / medians["off"]["p50_us"],
        "requests_per_run": _median(runs["on"], "requests"),
        "dashboard_cpu_share": _median(runs["on"], "dashboard_cpu_share"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 3 runs of each")
    parser.add_argument("--repeat", type=int, help="runs of each setting")
    parser.add_argument("--measure", choices=("off", "on", "idle"), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=tuple(SIZES), default="full", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        poll(args.client)
        return 0
    if args.measure:
        print(MARKER + json.dumps(measure(args.measure, args.mode)), flush=True)
        return 0
    mode = "quick" if args.quick else "full"
    load_before = os.getloadavg()[0]
    result = compare(mode, args.repeat or SIZES[mode]["repeat"])
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    table = _table(result)
    print("\n" + table)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    TABLE.write_text(table)
    print(f"written to {RESULTS} and {TABLE}")
    return 0


def _table(result: dict[str, Any]) -> str:
    """The markdown the dashboard's documentation page includes."""
    off, on = result["medians"]["off"], result["medians"]["on"]
    before, after = result["load_average"]
    return (
        "| dashboard | no-op `submit`, tasks/s | round trip p50 | p99 |\n|---|---|---|---|\n"
        f"| off | {off['tasks_per_s']:,.0f} | {off['p50_us']:.0f} us | {off['p99_us']:.0f} us |\n"
        f"| on, page polled every {POLL:.0f} s, `/metrics` every {SCRAPE * POLL:.0f} s | "
        f"{on['tasks_per_s']:,.0f} | "
        f"{on['p50_us']:.0f} us | {on['p99_us']:.0f} us |\n"
        f"| on / off | {result['throughput_on_over_off']:.3f} | "
        f"{result['p50_on_over_off']:.3f} | |\n\n"
        f"Medians of {result['repeat']} runs of each ({result['mode']} sizes), "
        f"{result['requests_per_run']:.0f} requests per run with the dashboard on; load "
        f"average {before} before, {after} after (`benchmarks/dashboard.json`). The "
        "dashboard's own thread used "
        f"{100 * result['dashboard_cpu_share']:.2f}% of a CPU while the executor was timed "
        "(median): the part of the executor's time, held under one interpreter lock, that "
        "serving the page took.\n"
    )


if __name__ == "__main__":
    sys.exit(main())
