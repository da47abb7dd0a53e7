"""Slurm against local: time to N connected workers, and how many submissions it took.

Needs a running cluster (``bash scripts/slurm-cluster.sh start``, then
``export SLURM_CONF=/var/lib/fiberexec-slurm/slurm.conf``). Run from the repository root::

    python -m benchmarks.slurm_bench [--sizes 2,8,32] [--repeats 1]

Each measurement is a fresh executor: the clock starts before the executor is constructed and
stops when the N-th worker has connected (counted from the executor's own log, no polling).
For Slurm the table also shows how many ``sbatch`` calls started the N workers.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections.abc import Callable

from benchmarks import tasks
from fiberexec import FiberExecutor
from fiberexec.backend import Backend
from fiberexec.backends.local import LocalBackend
from fiberexec.backends.slurm import SlurmBackend


class _Count(logging.Handler):
    """Releases a semaphore for every log record that contains ``needle``."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.INFO)
        self.needle = needle
        self.count = threading.Semaphore(0)
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.seen += 1
            self.count.release()


def time_to_workers(make: Callable[[], Backend], n: int) -> tuple[float, int]:
    """Seconds from constructing an executor to ``n`` connected workers; sbatch calls made."""
    connected, arrays = _Count("connected"), _Count("submitted job array")
    loggers = [logging.getLogger("fiberexec"), logging.getLogger("fiberexec.backends.slurm")]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    loggers[0].addHandler(connected)
    loggers[1].addHandler(arrays)
    backend = make()
    try:
        start = time.perf_counter()
        ex = FiberExecutor(n, min_workers=n, backend=backend)
        ex.submit(tasks.noop)
        for _ in range(n):
            if not connected.count.acquire(timeout=300):
                raise TimeoutError(f"{n} workers did not connect within 300 s")
        elapsed = time.perf_counter() - start
        ex.shutdown()
        return elapsed, arrays.seen
    finally:
        loggers[0].removeHandler(connected)
        loggers[1].removeHandler(arrays)
        backend.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,8,32", help="comma-separated worker counts")
    parser.add_argument("--repeats", type=int, default=1, help="median of this many runs")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    systems: dict[str, Callable[[], Backend]] = {
        "local": LocalBackend,
        "slurm": lambda: SlurmBackend(advertise_host="127.0.0.1", poll_interval=0.25),
    }
    print("| time to N connected workers, s | local | slurm | slurm / local | sbatch calls |")
    print("|---|---|---|---|---|")
    for n in sizes:
        local = statistics.median(time_to_workers(systems["local"], n)[0]
                                  for _ in range(args.repeats))
        runs = [time_to_workers(systems["slurm"], n) for _ in range(args.repeats)]
        slurm = statistics.median(t for t, _ in runs)
        calls = max(c for _, c in runs)
        print(f"| N = {n} | {local:.2f} | {slurm:.2f} | {slurm / local:.1f}x | {calls} |",
              flush=True)


if __name__ == "__main__":
    main()
