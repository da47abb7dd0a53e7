"""Docker against local: time to N running container workers, and core workloads on both.

Needs a running engine and the test image (``bash scripts/docker-engine.sh start`` and
``bash scripts/build-test-image.sh``). Run from the repository root (workers import
``benchmarks.tasks`` from the bind-mounted working directory)::

    python -m benchmarks.docker_bench [--image fiberexec-test:latest] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import tasks
from fiberexec import FiberExecutor
from fiberexec.backend import Backend
from fiberexec.backends.docker import DockerBackend
from fiberexec.backends.local import LocalBackend

Row = dict[str, float]


class _Connected(logging.Handler):
    """Releases a semaphore for every worker that connects (no polling for readiness)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = threading.Semaphore(0)

    def emit(self, record: logging.LogRecord) -> None:
        if "connected" in record.getMessage():
            self.count.release()


def time_to_workers(make: Callable[[], Backend], n: int) -> float:
    """Seconds from constructing an executor to ``n`` connected workers."""
    handler = _Connected()
    logger = logging.getLogger("fiberexec")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    backend = make()
    try:
        start = time.perf_counter()
        ex = FiberExecutor(n, backend=backend)
        ex.submit(tasks.noop)
        for _ in range(n):
            if not handler.count.acquire(timeout=300):
                raise TimeoutError(f"{n} workers did not connect within 300 s")
        elapsed = time.perf_counter() - start
        ex.shutdown()
        return elapsed
    finally:
        logger.removeHandler(handler)
        backend.close()


def workloads(make: Callable[[], Backend], quick: bool) -> Row:
    backend = make()
    row: Row = {}
    try:
        with FiberExecutor(2, backend=backend) as ex:
            ex.submit(tasks.noop).result(timeout=300)
            n = 2000 if quick else 10000
            start = time.perf_counter()
            for f in [ex.submit(tasks.noop) for _ in range(n)]:
                f.result(timeout=120)
            row["submit tasks/s"] = n / (time.perf_counter() - start)
            times = []
            for _ in range(200 if quick else 1000):
                start = time.perf_counter()
                ex.submit(tasks.noop).result(timeout=60)
                times.append(time.perf_counter() - start)
            row["latency p50 us"] = statistics.median(times) * 1e6
            array = np.zeros(10 << 20, dtype=np.uint8)
            k = 5 if quick else 20
            start = time.perf_counter()
            for _ in range(k):
                ex.submit(tasks.array_nbytes, array).result(timeout=60)
            row["10 MiB to task MiB/s"] = 10 * k / (time.perf_counter() - start)
            ex.submit(tasks.cached_array).result(timeout=60)
            start = time.perf_counter()
            for _ in range(k):
                ex.submit(tasks.cached_array).result(timeout=60)
            row["10 MiB from task MiB/s"] = 10 * k / (time.perf_counter() - start)
            m = 200 if quick else 1000
            start = time.perf_counter()
            for f in [ex.submit(tasks.sleep_1ms) for _ in range(m)]:
                f.result(timeout=120)
            row["1 ms tasks efficiency"] = (m * 0.001 / 2) / (time.perf_counter() - start)
    finally:
        backend.close()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", default="fiberexec-test:latest")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    systems: dict[str, Callable[[], Backend]] = {
        "local": LocalBackend,
        "docker": lambda: DockerBackend(image=args.image),
    }
    print("| time to N connected workers, s | " + " | ".join(systems) + " |")
    print("|---|" + "---|" * len(systems))
    for n in (2, 4) if args.quick else (2, 4, 8, 16):
        cells = [f"{time_to_workers(make, n):.2f}" for make in systems.values()]
        print(f"| N = {n} | " + " | ".join(cells) + " |")
    rows: dict[str, Row] = {name: workloads(make, args.quick) for name, make in systems.items()}
    print()
    print("| workload (2 workers) | local | docker | docker / local |")
    print("|---|---|---|---|")
    for key in rows["local"]:
        local, docker = rows["local"][key], rows["docker"][key]
        print(f"| {key} | {_fmt(local)} | {_fmt(docker)} | {docker / local:.2f}x |")


def _fmt(value: Any) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


if __name__ == "__main__":
    main()
