"""One measurement in a fresh process: ``python -m benchmarks.measure WORKLOAD SYSTEM MODE``.

Prints one line, ``BENCH-RESULT {json}``, that `benchmarks.run` parses (anything else on
stdout, such as a worker's output, is ignored).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

MARKER = "BENCH-RESULT "


def report(measure: Callable[[], dict[str, Any]]) -> int:
    """Run ``measure`` and print its metrics behind `MARKER` (or ``{"error": ...}``, the
    traceback on stderr): the one line a runner parses from a measurement's process."""
    try:
        metrics = measure()
    except Exception as exc:
        traceback.print_exc()
        metrics = {"error": f"{type(exc).__name__}: {exc}"}
    print(MARKER + json.dumps(metrics), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("system")
    parser.add_argument("mode", choices=("full", "quick"))
    parser.add_argument("--iters", type=int, default=0, help="ES fitness iterations")
    parser.add_argument("--task-s", type=float, default=0.0,
                        help="ES: one call's time, as calibrated (default: timed here)")
    parser.add_argument("--shards", type=int, default=1, help="simulated workload's shards")
    parser.add_argument("--workers", type=int, default=0,
                        help="simulated workload's workers (default: the mode's size)")
    parser.add_argument("--link", choices=("unix", "tcp"), default="unix",
                        help="how simulated workers connect: the local link, or TCP")
    args = parser.parse_args(argv)

    from benchmarks import workloads  # after argument parsing: --help stays fast

    sizes = workloads.QUICK if args.mode == "quick" else workloads.FULL

    def measure() -> dict[str, Any]:
        if args.workload == "calibrate":
            from benchmarks import tasks

            iters, seconds = tasks.calibrate_es()
            return {"iters": iters, "task_s": seconds}
        if args.workload == "es":
            return workloads.es_generation(args.system, sizes, args.iters, args.task_s)
        if args.workload == "simulated":
            simulated = {**sizes, "sim_workers": args.workers} if args.workers else sizes
            return workloads.simulated_dispatch(args.system, simulated, args.shards, args.link)
        if args.workload == "output":
            return workloads.output_forwarding(args.system, sizes)
        return workloads.WORKLOADS[args.workload](args.system, sizes)

    return report(measure)


if __name__ == "__main__":
    sys.exit(main())
