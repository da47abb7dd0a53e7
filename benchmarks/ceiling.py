"""What the machine allows before any executor: ``python -m benchmarks.ceiling``.

Two ceilings that efficiency targets meet on a small machine, measured with no executor at
all (no messages, no scheduling, nothing pickled):

* ``es``: the ES workload's task (`tasks.es_fitness`, calibrated as `benchmarks.run` does)
  run back to back in `WORKERS` forked processes at once, against the same run alone in
  one process. Their ratio is the ES efficiency a perfect executor would reach: processes
  running together slow each other down (shared caches, memory bandwidth).
* ``sleep``: what ``time.sleep(0.001)`` takes here. The 1 ms tasks' efficiency counts
  1 ms a task, so it can be at most 1 ms over that (timer slack and wake-up latency).

Prints a JSON object; ``--output`` also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import tasks
from benchmarks.workloads import WORKERS


def _es_loop(iters: int, calls: int) -> float:
    """Seconds a call of `tasks.es_fitness` took on average over ``calls`` back to back."""
    params = np.zeros(tasks.ES_DIM)
    start = time.perf_counter()
    for _ in range(calls):
        tasks.es_fitness(params, iters)
    return (time.perf_counter() - start) / calls


def es_ceiling(iters: int, calls: int) -> dict[str, float]:
    """The ES task alone, then in `WORKERS` forked processes at once (see the module)."""
    alone = _es_loop(iters, calls)
    pipes, pids = [], []
    for _ in range(WORKERS):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a child: measure, report, leave without the parent's exit handlers
            code = 1
            try:
                os.close(read)
                os.write(write, repr(_es_loop(iters, calls)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        pipes.append(read)
        pids.append(pid)
    together = []
    for read, pid in zip(pipes, pids, strict=True):
        with os.fdopen(read, "rb") as pipe:
            text = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not text:
            raise RuntimeError(f"a measuring process (pid {pid}) failed: status {status}")
        together.append(float(text))
    mean_together = statistics.fmean(together)
    return {"alone_s": alone, "together_s": mean_together, "efficiency": alone / mean_together}


def sleep_ceiling(calls: int) -> dict[str, float]:
    """What ``time.sleep(0.001)`` takes, on average over ``calls`` back to back."""
    start = time.perf_counter()
    for _ in range(calls):
        time.sleep(0.001)
    took = (time.perf_counter() - start) / calls
    return {"sleep_s": took, "efficiency": 0.001 / took}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--calls", type=int, default=500, help="task calls a run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    iters, task_s = tasks.calibrate_es()
    runs: dict[str, Any] = {"es": [], "sleep": []}
    for _ in range(args.repeat):
        runs["es"].append(es_ceiling(iters, args.calls))
        runs["sleep"].append(sleep_ceiling(args.calls))
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average_before": load,
        "workers": WORKERS, "es_iters": iters, "es_task_s": task_s,
        "es_efficiency_median": statistics.median(r["efficiency"] for r in runs["es"]),
        "sleep_efficiency_median": statistics.median(r["efficiency"] for r in runs["sleep"]),
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
