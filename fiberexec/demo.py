"""A real job on the local backend: estimate pi with Monte Carlo tasks.

Run it with ``python -m fiberexec.demo [--workers N] [--tasks N]``.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from concurrent.futures import as_completed

from fiberexec import FiberExecutor


def hits(seed: int, samples: int) -> int:
    """How many of ``samples`` random points in the unit square fall inside the circle."""
    rng = random.Random(seed)
    return sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(samples))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with FiberExecutor(max_workers=args.workers) as ex:
        futures = [ex.submit(hits, seed, args.samples) for seed in range(args.tasks)]
        inside = sum(f.result() for f in as_completed(futures))
        noop_start = time.perf_counter()
        n = 20_000
        for f in [ex.submit(abs, -i) for i in range(n)]:
            f.result()
        noop_rate = n / (time.perf_counter() - noop_start)
        stats = ex.stats()
    elapsed = time.perf_counter() - start
    estimate = 4 * inside / (args.tasks * args.samples)
    print(f"pi ~ {estimate:.5f} (error {abs(estimate - math.pi):.5f}) from "
          f"{args.tasks} tasks x {args.samples} samples on {args.workers} local workers")
    print(f"  {args.tasks / elapsed:.0f} Monte Carlo tasks/s overall, "
          f"{noop_rate:,.0f} no-op tasks/s; total {elapsed:.2f}s")
    print(f"  stats: {stats}")


if __name__ == "__main__":
    main()
