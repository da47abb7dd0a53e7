"""A real job on the local backend: estimate pi with Monte Carlo tasks, then time no-op tasks.

Run it with ``python -m fiberexec.demo [--workers N] [--tasks N] [--samples N]``.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from concurrent.futures import as_completed

from fiberexec import FiberExecutor

NOOPS = 20_000  # no-op tasks timed after the Monte Carlo ones


def hits(seed: int, samples: int) -> int:
    """How many of ``samples`` random points in the unit square fall inside the circle."""
    rng = random.Random(seed)
    return sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(samples))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number is needed, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1 is needed, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fiberexec.demo",
        description="Estimate pi with Monte Carlo tasks on local workers, then time "
                    f"{NOOPS:,} no-op tasks, and print what the executor counted.")
    parser.add_argument("--workers", type=_positive, default=2,
                        help="worker processes (default: 2)")
    parser.add_argument("--tasks", type=_positive, default=200,
                        help="Monte Carlo tasks (default: 200)")
    parser.add_argument("--samples", type=_positive, default=20_000,
                        help="random points per task (default: 20000)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with FiberExecutor(max_workers=args.workers) as ex:
        futures = [ex.submit(hits, seed, args.samples) for seed in range(args.tasks)]
        inside = sum(f.result() for f in as_completed(futures))
        monte_carlo = time.perf_counter() - start
        noop_start = time.perf_counter()
        for f in [ex.submit(abs, -i) for i in range(NOOPS)]:
            f.result()
        noop_rate = NOOPS / (time.perf_counter() - noop_start)
        stats = ex.stats()
    estimate = 4 * inside / (args.tasks * args.samples)
    print(f"pi ~ {estimate:.5f} (error {abs(estimate - math.pi):.5f}) from "
          f"{args.tasks} tasks x {args.samples} samples on {args.workers} local workers")
    print(f"  Monte Carlo: {monte_carlo:.2f}s, the workers' start included "
          f"({args.tasks / monte_carlo:.0f} tasks/s)")
    print(f"  no-op tasks: {noop_rate:,.0f} tasks/s (submit, then wait for each)")
    print(f"  ex.stats(): {stats.tasks_done} tasks done ({args.tasks} Monte Carlo + "
          f"{NOOPS:,} no-op), {stats.tasks_failed} failed, {stats.tasks_retried} retried, "
          f"{stats.workers_lost} workers lost")


if __name__ == "__main__":
    main()
