"""fiberexec across hosts: the ssh backend on the multi-host test bed (tests/testbed).

The executor runs in one network namespace, its workers in three others, each host joined
to a bridge by its own veth link, workers started over SSH by a real sshd. Round-trip time
is added with the test bed's delaying relay (the kernel here has no netem; the relay delays
each segment it reads, so a round trip costs twice the one-way delay plus the relay's own
cost, which the "measured RTT" column includes: a TCP ping-pong through the same path).
Bandwidth is capped with a ``tbf`` qdisc on the executor host's link. No TLS.

Needs root and what ``scripts/ssh-testbed.sh install`` installs. Run from the repository
root (workers import ``benchmarks.tasks`` from the shared tree)::

    python -m benchmarks.testbed_bench [--repeat 3]

Prints a markdown table with each target and whether it holds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from benchmarks import tasks
from fiberexec import FiberExecutor
from fiberexec.backends.ssh import SSHBackend
from tests.testbed.session import Lab, shared

WORKERS_PER_HOST = 2
TASKS_PER_WORKER = 400
LATENCY_SAMPLES = 300
PAYLOAD = 10 * 1024 * 1024
LINK_RATE = "1gbit"
LINK_MIB_S = 1e9 / 8 / 2**20  # 119.2 MiB/s
_FILL = itertools.count(1)  # each payload's byte value


@dataclass
class Row:
    workload: str
    value: float
    unit: str
    target: str
    holds: bool

    def line(self) -> str:
        verdict = "holds" if self.holds else "falls short"
        return f"| {self.workload} | {self.value:,.2f} {self.unit} | {self.target} | {verdict} |"


def backend(lab: Lab, hosts: list[str]) -> SSHBackend:
    return SSHBackend(hosts=hosts, python=sys.executable, slots=WORKERS_PER_HOST,
                      ssh_config=str(lab.site.ssh_config))


@contextlib.contextmanager
def executor(lab: Lab, workers: int, hosts: list[str]) -> Iterator[FiberExecutor]:
    with FiberExecutor(workers, backend=backend(lab, hosts)) as ex:
        list(ex.map(tasks.noop, range(workers * 20)))  # every worker up and warm
        yield ex


def efficiency(ex: FiberExecutor, workers: int) -> float:
    n = workers * TASKS_PER_WORKER
    start = time.perf_counter()
    futures = [ex.submit(tasks.sleep_1ms) for _ in range(n)]
    wait(futures)
    elapsed = time.perf_counter() - start
    return n * 0.001 / workers / elapsed


def latency(ex: FiberExecutor) -> tuple[float, float]:
    samples = []
    for _ in range(LATENCY_SAMPLES):
        start = time.perf_counter()
        ex.submit(tasks.noop).result()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def payload_rates(ex: FiberExecutor) -> tuple[float, float]:
    """MiB/s of 10 MiB to a task and back from one. Each call sends other bytes: a worker
    keeps a large argument it has seen (`arg_cache`), so the same array again would not
    cross the link at all."""
    array = np.full(PAYLOAD, next(_FILL) % 256, dtype=np.uint8)
    ex.submit(tasks.cached_array).result()  # the worker makes its array once, untimed
    start = time.perf_counter()
    assert ex.submit(tasks.array_nbytes, array).result() == PAYLOAD
    to_task = PAYLOAD / 2**20 / (time.perf_counter() - start)
    start = time.perf_counter()
    assert ex.submit(tasks.cached_array).result().nbytes == PAYLOAD
    from_task = PAYLOAD / 2**20 / (time.perf_counter() - start)
    return to_task, from_task


def median_of(repeat: int, fn: object, *args: object) -> object:
    runs = [fn(*args) for _ in range(repeat)]  # type: ignore[operator]
    if isinstance(runs[0], tuple):
        return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))
    return statistics.median(runs)


def stdlib_efficiency(workers: int) -> float:
    """The same 1 ms workload on a local ProcessPoolExecutor: how loaded is this machine?"""
    with ProcessPoolExecutor(workers) as pool:
        wait([pool.submit(tasks.noop) for _ in range(workers * 20)])
        start = time.perf_counter()
        wait([pool.submit(tasks.sleep_1ms) for _ in range(workers * TASKS_PER_WORKER)])
        elapsed = time.perf_counter() - start
    return TASKS_PER_WORKER * 0.001 / elapsed


def measure(lab: Lab, repeat: int) -> list[Row]:
    hosts = lab.targets()
    ref = float(median_of(repeat, stdlib_efficiency, WORKERS_PER_HOST))  # type: ignore[arg-type]
    rows = [Row(f"1 ms tasks, stdlib ProcessPoolExecutor({WORKERS_PER_HOST}) on loopback, "
                "same run", ref, "efficiency", "(reference)", True)]
    for rtt_ms in (0.0, 0.5, 2.0):
        delay = lab.delay(rtt_ms / 2000) if rtt_ms else contextlib.nullcontext()
        with delay:
            rows += at_rtt(lab, hosts, rtt_ms, repeat)
    lab.bed.rate("ex", LINK_RATE)
    try:
        with executor(lab, 1, hosts[:1]) as ex:
            to_task, from_task = median_of(repeat, payload_rates, ex)  # type: ignore[misc]
    finally:
        lab.bed.clear_rate("ex")
    for direction, rate in (("to", to_task), ("from", from_task)):
        rows.append(Row(f"10 MiB {direction} a task over a 1 Gbit/s tbf link", rate, "MiB/s",
                        f">= 90% of {LINK_MIB_S:.1f} = {0.9 * LINK_MIB_S:.1f} MiB/s",
                        rate >= 0.9 * LINK_MIB_S))
    return rows


def at_rtt(lab: Lab, hosts: list[str], rtt_ms: float, repeat: int) -> list[Row]:
    rows = []
    rtt = lab.rtt("w1")
    label = f"+{rtt_ms} ms RTT (measured {rtt * 1e3:.2f} ms)"
    for used in (hosts[:1], hosts):
        workers = WORKERS_PER_HOST * len(used)
        with executor(lab, workers, used) as ex:
            eff = float(median_of(repeat, efficiency, ex, workers))  # type: ignore[arg-type]
        judged = rtt_ms == 2.0 and len(used) == 1
        rows.append(Row(f"1 ms tasks, {workers} workers on {len(used)} host(s), {label}", eff,
                        "efficiency", ">= 0.85" if judged else "(reported)",
                        eff >= 0.85 or not judged))
    with executor(lab, 1, hosts[:1]) as ex:
        p50, p99 = median_of(repeat, latency, ex)  # type: ignore[misc]
    limit = rtt + 0.0002
    rows.append(Row(f"single-task latency p50, {label}", p50 * 1e3, "ms",
                    f"<= RTT + 0.2 ms = {limit * 1e3:.2f} ms", p50 <= limit))
    rows.append(Row(f"single-task latency p99, {label}", p99 * 1e3, "ms", "(reported)", True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="fiberexec on the multi-host test bed")
    parser.add_argument("--repeat", type=int, default=3, help="runs per number (median)")
    args = parser.parse_args()
    with shared() as lab:
        rows = measure(lab, args.repeat)
    print("| workload | measured | target | verdict |")
    print("|---|---|---|---|")
    for row in rows:
        print(row.line())


if __name__ == "__main__":
    main()
