"""Elastic pools and what `running()` and `cancel()` say (``python -m benchmarks.elastic``).

Two workloads, each system in a fresh process (`benchmarks.fresh`), the systems alternating
and swapping which goes first in each repeat:

* **growing**: ``(max_workers=6, min_workers=1)`` (the stdlib: ``ProcessPoolExecutor(6)``,
  which has no minimum), warmed with one instant task, then 60 tasks of ``time.sleep(0.5)``:
  the wall time, how many workers ran them, and the most futures marked running at once
  (sampled every 10 ms). Target: within 9 s, on >= 5 workers, never more than
  ``2 * max_workers + 1`` (13) running.
* **cancel**: a pool of 2 after 50 instant calls of a function, then 20 calls of it that
  sleep 0.5 s; 0.3 s later, how many are running and how many ``cancel()`` cancels, and
  that no cancelled call ran (each call leaves a file). The stdlib cancels all but its
  call queue's ``max_workers + 1`` and what it runs.
* **blocked**: a pool of 2 after 50 instant calls of a function, then one call of it that
  waits 2 s in C holding the GIL, then 2,000 instant calls: when the instant ones are all
  done, and whether that was before the blocking one ended (nothing waits behind it while
  the other worker could run it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from benchmarks import fresh
from benchmarks.scale_tasks import gil_sleep, mark_and_sleep, sleep_pid

HERE = Path(__file__).resolve().parent
SYSTEMS = ("stdlib", "fiberexec")
WORKLOADS = ("growing", "cancel", "blocked")
BLOCK = 2.0  # seconds the blocking call holds the GIL
TIMEOUT = 120.0


def _make(system: str, workers: int, minimum: int | None = None) -> Any:
    if system == "stdlib":
        return ProcessPoolExecutor(workers)
    from fiberexec import FiberExecutor

    return FiberExecutor(workers, min_workers=minimum if minimum is not None else workers)


def _most_running(futures: list[Future[Any]], stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.01):  # a sample every 10 ms of what the futures say
        peak[0] = max(peak[0], sum(f.running() for f in futures))


def growing(system: str) -> dict[str, Any]:
    with _make(system, 6, minimum=1) as ex:
        ex.submit(sleep_pid, 0).result(timeout=TIMEOUT)
        start = time.perf_counter()
        futures = [ex.submit(sleep_pid, 0.5) for _ in range(60)]
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=_most_running, args=(futures, stop, peak))
        sampler.start()
        try:
            pids = [f.result(timeout=TIMEOUT) for f in futures]
        finally:
            stop.set()
            sampler.join()
        seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "workers_used": len(set(pids)),
            "most_running": peak[0]}


def cancel(system: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, _make(system, 2) as ex:
        list(ex.map(mark_and_sleep, [os.path.join(tmp, f"w{i}") for i in range(50)],
                    [0.0] * 50))
        futures = [ex.submit(mark_and_sleep, os.path.join(tmp, str(i)), 0.5)
                   for i in range(20)]
        time.sleep(0.3)  # the workload's own pause: the tasks are under way
        running = sum(f.running() for f in futures)
        asked = time.perf_counter()
        cancelled = {i for i, f in enumerate(futures) if f.cancel()}
        cancel_ms = (time.perf_counter() - asked) * 1000 / len(futures)
        wait(futures, timeout=TIMEOUT)
        ex.shutdown(wait=True)
        ran = {i for i in range(20) if os.path.exists(os.path.join(tmp, str(i)))}
    return {"running_at_0.3s": running, "cancelled": len(cancelled),
            "cancelled_that_ran": len(cancelled & ran), "ran": len(ran),
            "cancel_ms_each": round(cancel_ms, 3)}


def blocked(system: str) -> dict[str, Any]:
    with _make(system, 2) as ex:
        list(ex.map(gil_sleep, [0.0] * 50, range(50)))
        start = time.perf_counter()
        blocker = ex.submit(gil_sleep, BLOCK, -1)
        quick = [ex.submit(gil_sleep, 0.0, i) for i in range(2000)]
        wait(quick, timeout=TIMEOUT)
        seconds = time.perf_counter() - start
        before = not blocker.done()
        blocker.result(timeout=TIMEOUT)
    return {"quick_done_s": round(seconds, 3), "before_the_blocker": before}


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    def med(runs: list[dict[str, Any]], key: str) -> Any:
        values = [r[key] for r in runs if key in r]
        return statistics.median(values) if values else "-"

    lines = ["| workload | system | seconds / running at 0.3 s / quick ones done, s "
             "| workers used / cancelled of 20 / before the blocker "
             "| most running / cancelled that ran | runs |", "|---|---|---|---|---|---|"]
    for system, by in results.items():
        g, c, b = by.get("growing", []), by.get("cancel", []), by.get("blocked", [])
        if g:
            lines.append(f"| growing 60 x 0.5 s, max 6 | {system} | {med(g, 'seconds')} | "
                         f"{med(g, 'workers_used')} | {max(r.get('most_running', 0) for r in g)}"
                         f" | {len(g)} |")
        if c:
            lines.append(f"| cancel 20 x 0.5 s on 2 | {system} | {med(c, 'running_at_0.3s')} | "
                         f"{med(c, 'cancelled')} | "
                         f"{sum(r.get('cancelled_that_ran', 0) for r in c)} | {len(c)} |")
        if b:
            lines.append(f"| blocked: 2,000 instant behind a {BLOCK:g} s GIL hold, on 2 "
                         f"| {system} | {med(b, 'quick_done_s')} | "
                         f"{sum(bool(r.get('before_the_blocker')) for r in b)} of {len(b)} | - "
                         f"| {len(b)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path, default=HERE / "elastic.json")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SYSTEM"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        from benchmarks.measure import report

        workload, system = options.one
        measure = {"growing": growing, "cancel": cancel, "blocked": blocked}[workload]
        return report(lambda: measure(system))
    results: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in SYSTEMS}
    load = os.getloadavg()[0]
    for repeat in range(options.repeat):
        for workload in WORKLOADS:
            order = SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]
            for system in order:
                metrics = fresh.run("benchmarks.elastic", ["--one", workload, system],
                                    TIMEOUT * 2)
                print(f"  [{repeat + 1}/{options.repeat}] {workload:8} {system:10} {metrics}")
                results[system].setdefault(workload, []).append(metrics)
    print(table(results))
    print(f"\nload average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    options.output.write_text(json.dumps(
        {"load_average_before": load, "results": results}, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
