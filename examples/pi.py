"""Estimate pi with Monte Carlo tasks, watching progress as they finish.

    python examples/pi.py                       # 400 tasks on the local backend
    python examples/pi.py --small               # a few tasks (what the tests run)
    FIBEREXEC_BACKEND=docker FIBEREXEC_IMAGE=me/app:1 python examples/pi.py

With tqdm installed (``pip install 'fiberexec[progress]'``) a progress bar follows the tasks;
without it, the executor's ``stats()`` is printed every 100 results.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
from collections.abc import Iterable
from concurrent.futures import Future, as_completed

from fiberexec import FiberExecutor

try:
    from fiberexec import progress_bar
except ImportError:  # fiberexec before progress_bar was public
    from fiberexec._progress import progress_bar

HAVE_TQDM = importlib.util.find_spec("tqdm") is not None


def inside_circle(seed: int, samples: int) -> int:
    """How many of ``samples`` random points in the unit square fall in the quarter circle."""
    rng = random.Random(seed)
    return sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=None,
                        help="default: FIBEREXEC_MAX_WORKERS, the config file, or the CPUs")
    parser.add_argument("--small", action="store_true", help="a quick run")
    args = parser.parse_args()
    if args.small:
        args.tasks, args.samples = 20, 2_000
    with FiberExecutor(args.workers) as ex:
        futures = [ex.submit(inside_circle, seed, args.samples) for seed in range(args.tasks)]
        hits = 0
        for i, future in enumerate(_track(as_completed(futures), len(futures)), 1):
            hits += future.result()
            if i % 100 == 0 and not HAVE_TQDM:
                print(f"  {i}/{len(futures)} done; {ex.stats()}")
        stats = ex.stats()
    estimate = 4 * hits / (args.tasks * args.samples)
    print(f"pi ~ {estimate:.4f} (error {abs(estimate - math.pi):.4f}) "
          f"from {args.tasks} tasks on {ex.max_workers} workers")
    print(f"tasks done: {stats.tasks_done}, failed: {stats.tasks_failed}, "
          f"workers lost: {stats.workers_lost}")


def _track(futures: Iterable[Future[int]], total: int) -> Iterable[Future[int]]:
    """A progress bar over ``futures`` when tqdm is installed, else ``futures`` unchanged."""
    try:
        return progress_bar(futures, total=total, leave=False)
    except ImportError:
        return futures


if __name__ == "__main__":
    main()
