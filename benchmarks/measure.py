"""One measurement in a fresh process: ``python -m benchmarks.measure WORKLOAD SYSTEM MODE``.

Prints one line, ``BENCH-RESULT {json}``, that `benchmarks.run` parses (anything else on
stdout, such as a worker's output, is ignored).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

MARKER = "BENCH-RESULT "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload")
    parser.add_argument("system")
    parser.add_argument("mode", choices=("full", "quick"))
    parser.add_argument("--iters", type=int, default=0, help="ES fitness iterations")
    parser.add_argument("--shards", type=int, default=1, help="simulated workload's shards")
    parser.add_argument("--workers", type=int, default=0,
                        help="simulated workload's workers (default: the mode's size)")
    parser.add_argument("--link", choices=("unix", "nng"), default="unix",
                        help="how simulated workers connect: the local link, or Pair1 over TCP")
    args = parser.parse_args(argv)

    from benchmarks import workloads  # after argument parsing: --help stays fast

    metrics: dict[str, Any]
    sizes = workloads.QUICK if args.mode == "quick" else workloads.FULL
    try:
        if args.workload == "calibrate":
            from benchmarks import tasks

            iters, seconds = tasks.calibrate_es()
            metrics = {"iters": iters, "task_s": seconds}
        elif args.workload == "es":
            metrics = workloads.es_generation(args.system, sizes, args.iters)
        elif args.workload == "simulated":
            if args.workers:
                sizes = {**sizes, "sim_workers": args.workers}
            metrics = workloads.simulated_dispatch(args.system, sizes, args.shards, args.link)
        elif args.workload == "output":
            metrics = workloads.output_forwarding(args.system, sizes)
        else:
            metrics = workloads.WORKLOADS[args.workload](args.system, sizes)
    except Exception as exc:
        traceback.print_exc()
        metrics = {"error": f"{type(exc).__name__}: {exc}"}
    print(MARKER + json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
