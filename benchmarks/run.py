"""Run the benchmark suite: ``python -m benchmarks.run [--quick] [--plot] [--repeat N]``.

Every measurement runs in a fresh process (``python -m benchmarks.measure``), one per
workload, system and repeat; repeats are interleaved across systems so that a noisy moment
hurts all of them alike. The table shows the median of the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report
from benchmarks.measure import MARKER
from fiberexec import _threads

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMS = ("stdlib", "mp.Pool", "fiberexec")
WORKLOADS = ("submit", "map", "barrier", "rounds_n", "small_maps", "burst", "latency", "array",
             "objects", "first_result", "remake", "shutdown", "es", "es_8mb", "matmul")
#: (row key, simulated workers, shards). Simulated workers connect over the local link, as
#: workers on the executor's host do (``measure simulated --link tcp`` for a TCP stream, as
#: workers on other hosts without TLS connect).
SIM_RUNS = (("simulated_1", 1024, 1), ("simulated_4", 1024, 4), ("simulated_4096", 4096, 1))
#: One thread per numpy process, so two workers never fight over BLAS threads.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: Workloads that run as a user's program starts: none of the numerical libraries' thread
#: variables set, each system's workers left to what it tells them.
OWN_THREADS = {"matmul"}

Metrics = dict[str, Any]


def measure(args: list[str], timeout: float) -> Metrics:
    """Run one measurement in a fresh process; its metrics, or ``{"error": ...}``."""
    env = {**os.environ, **SINGLE_THREADED,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args[0] in OWN_THREADS:
        for name in _threads.VARIABLES:
            env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.measure", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # so a timeout can kill it with everything it started
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return {"error": f"timed out after {timeout:.0f}s"}
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            metrics: Metrics = json.loads(line[len(MARKER):])
            if "error" in metrics:
                print(f"    {' '.join(args)}: {metrics['error']}\n{err[-2000:]}", file=sys.stderr)
            return metrics
    return {"error": f"exit code {proc.returncode}: {err.strip()[-300:]}"}


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def median(samples: list[Metrics]) -> Metrics:
    """Per-key median over the repeats that succeeded; non-numbers from the first one."""
    good = [s for s in samples if "error" not in s]
    if not good:
        return samples[-1]
    merged: Metrics = {}
    for key, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            merged[key] = statistics.median(s[key] for s in good)
        else:
            merged[key] = value
    merged["repeats"] = len(good)
    if len(good) < len(samples):
        merged["failed_repeats"] = len(samples) - len(good)
    return merged


def plan(workloads: list[str], systems: list[str], mode: str, iters: int,
         task_s: float = 0.0) -> list[tuple[str, str, list[str]]]:
    """The measurements of one repeat, as ``(row key, system, measure args)``."""
    steps = []
    for workload in workloads:
        if workload == "output":
            steps.append(("output", "fiberexec", ["output", "fiberexec", mode]))
            continue
        if workload == "simulated":
            for key, workers, shards in SIM_RUNS:
                steps.append((key, "fiberexec", ["simulated", "fiberexec", mode, "--shards",
                                                 str(shards), "--workers", str(workers)]))
            continue
        extra = ["--iters", str(iters), "--task-s", repr(task_s)] if workload == "es" else []
        steps.extend((workload, system, [workload, system, mode, *extra]) for system in systems)
    return steps


def run(options: argparse.Namespace) -> tuple[report.Results, dict[str, Any]]:
    mode = "quick" if options.quick else "full"
    repeat = options.repeat or (1 if options.quick else 3)
    timeout = options.timeout or (120.0 if options.quick else 600.0)
    workloads = (options.workloads.split(",") if options.workloads
                 else [*WORKLOADS, "simulated", "output"])
    systems = options.systems.split(",") if options.systems else list(SYSTEMS)
    started, load_before = time.monotonic(), os.getloadavg()
    calibration = measure(["calibrate", "stdlib", mode], timeout) if "es" in workloads else {}
    iters = int(calibration.get("iters", 0))
    samples: dict[tuple[str, str], list[Metrics]] = {}
    steps = plan(workloads, systems, mode, iters, float(calibration.get("task_s", 0.0)))
    for r in range(repeat):
        for key, system, args in steps:
            began = time.monotonic()
            metrics = measure(args, timeout)
            samples.setdefault((key, system), []).append(metrics)
            print(f"  [{r + 1}/{repeat}] {key:<13} {system:<10} {time.monotonic() - began:5.1f}s "
                  f"{_brief(metrics)}", file=sys.stderr, flush=True)
    results: report.Results = {}
    for (key, system), runs in samples.items():
        results.setdefault(key, {})[system] = median(runs)
    meta = {
        "mode": mode, "repeat": repeat, "workers": 2, "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.platform(),
        "es_calibration": calibration, "seconds": round(time.monotonic() - started, 1),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return results, meta


def _brief(metrics: Metrics) -> str:
    if "error" in metrics:
        return f"ERROR {metrics['error'][:80]}"
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in metrics.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat (for CI)")
    parser.add_argument("--repeat", type=int, default=0, help="runs per measurement (3; quick 1)")
    parser.add_argument("--plot", action="store_true", help=f"write {HERE / 'results.png'}")
    parser.add_argument("--workloads", default="",
                        help=f"comma-separated subset of {','.join(WORKLOADS)},simulated,output")
    parser.add_argument("--systems", default="", help="comma-separated subset of "
                        f"{','.join(SYSTEMS)} (simulated and output are fiberexec only)")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds one measurement may take (120; full 600)")
    parser.add_argument("--output", type=Path, default=HERE / "results.json")
    options = parser.parse_args(argv)
    results, meta = run(options)
    print(report.table(results))
    print(f"\n{meta['mode']} run, median of {meta['repeat']}, {meta['seconds']}s; "
          f"ES task calibrated to {meta['es_calibration'] or '-'}")
    report.write_json(options.output, results, meta)
    if options.plot:
        report.plot(HERE / "results.png", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
