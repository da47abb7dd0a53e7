"""What the machine allows before any executor: ``python -m benchmarks.ceiling``.

Three ceilings that the short-task targets meet on a small machine. The first two are
measured with no executor at all (no messages, no scheduling, nothing pickled):

* ``es``: the ES workload's task (`tasks.es_fitness`, calibrated as `benchmarks.run` does)
  run back to back in `WORKERS` forked processes at once, against the same run alone in
  one process. Their ratio is the ES efficiency a perfect executor would reach: processes
  running together slow each other down (shared caches, memory bandwidth).
* ``sleep``: what ``time.sleep(0.001)`` takes here. The 1 ms tasks' efficiency counts
  1 ms a task, so it can be at most 1 ms over that (timer slack and wake-up latency).

The third, ``skeleton``, is the least a pool of processes can do: `WORKERS` workers forked
from this process after its imports, one socket pair each, a task's function and arguments
pickled by reference behind a 4-byte length, the worker calling it and sending its pickled
result back the same way; the parent one thread that blocks in ``recv`` or ``select``, with
no futures, no bookkeeping and no second thread. It runs the suite's own workloads with
the suite's sizes (`benchmarks.workloads.FULL`): a no-op's round trip (p50 and p99), 1 ms
tasks in rounds of N = `WORKERS`, 1 ms tasks all at once (each worker kept two tasks deep,
so it never waits for the parent), and the ES generation (the same loop, with its numpy
work in the parent). What it reaches is what any pool of processes could reach here; an
executor, which adds a caller's thread beside its I/O, futures and a scheduler, reaches
less.

Prints a JSON object; ``--output`` also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import socket
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import tasks
from benchmarks.workloads import FULL, WORKERS, percentile

_LENGTH = struct.Struct("<I")


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


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other end closed its socket")
        data += chunk
    return bytes(data)


def _receive(sock: socket.socket) -> Any:
    (size,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    return pickle.loads(_read_exactly(sock, size))


def _send(sock: socket.socket, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _serve(sock: socket.socket) -> None:
    """A skeleton worker: call what comes, send back what it returned, until EOF."""
    while True:
        try:
            fn, args = _receive(sock)
        except EOFError:
            return
        _send(sock, fn(*args))


class Skeleton:
    """The least a pool of processes can do (see the module); ``with Skeleton(n) as pool``."""

    def __init__(self, workers: int) -> None:
        self.socks: list[socket.socket] = []
        self.pids: list[int] = []
        for _ in range(workers):
            parent, child = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # a worker: serve, then leave without the parent's exit handlers
                code = 1
                try:
                    parent.close()
                    for other in self.socks:
                        other.close()
                    _serve(child)
                    code = 0
                finally:
                    os._exit(code)
            child.close()
            self.socks.append(parent)
            self.pids.append(pid)

    def __enter__(self) -> Skeleton:
        return self

    def __exit__(self, *_exc: object) -> None:
        for sock in self.socks:
            sock.close()
        for pid in self.pids:
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"a skeleton worker (pid {pid}) failed: status {status}")

    def call(self, worker: int, fn: Callable[..., Any], *args: Any) -> Any:
        _send(self.socks[worker], (fn, args))
        return _receive(self.socks[worker])

    def run_all(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]],
                depth: int = 2) -> list[Any]:
        """Every call's result, in order: each worker kept ``depth`` calls deep."""
        results: list[Any] = [None] * len(calls)
        pending = iter(enumerate(calls))
        owed: dict[socket.socket, list[int]] = {sock: [] for sock in self.socks}

        def feed(sock: socket.socket) -> None:
            while len(owed[sock]) < depth:
                nxt = next(pending, None)
                if nxt is None:
                    return
                index, call = nxt
                _send(sock, call)
                owed[sock].append(index)

        for sock in self.socks:
            feed(sock)
        while any(owed.values()):
            ready, _, _ = select.select([s for s, o in owed.items() if o], [], [], 60.0)
            if not ready:
                raise TimeoutError("no skeleton worker answered within 60 s")
            for sock in ready:
                results[owed[sock].pop(0)] = _receive(sock)
                feed(sock)
        return results


def skeleton_ceiling(iters: int, task_s: float) -> dict[str, float]:
    """The suite's short-task workloads on `Skeleton` (see the module), with its sizes."""
    sizes = FULL
    report: dict[str, float] = {}
    with Skeleton(WORKERS) as pool:
        pool.run_all([(tasks.noop, ())] * (8 * WORKERS))
        samples = []
        for i in range(sizes["latency_warmup"] + sizes["latency_n"]):
            start = time.perf_counter_ns()
            pool.call(0, tasks.noop)
            if i >= sizes["latency_warmup"]:
                samples.append((time.perf_counter_ns() - start) / 1000)
        samples.sort()
        report["round_trip_p50_us"] = percentile(samples, 50)
        report["round_trip_p99_us"] = percentile(samples, 99)

        rounds = sizes["rounds_n_rounds"]
        start = time.perf_counter()
        for _ in range(rounds):
            pool.run_all([(tasks.sleep_1ms, ())] * WORKERS, depth=1)
        report["rounds_n_efficiency"] = rounds * 0.001 / (time.perf_counter() - start)

        n = sizes["burst_n"]
        start = time.perf_counter()
        pool.run_all([(tasks.sleep_1ms, ())] * n)
        report["all_at_once_efficiency"] = n * 0.001 / WORKERS / (time.perf_counter() - start)

        population, generations = sizes["es_population"], sizes["es_generations"]
        rng = np.random.default_rng(0)
        theta = np.zeros(tasks.ES_DIM)
        pool.run_all([(tasks.es_fitness, (theta, iters))] * (2 * WORKERS))
        start = time.perf_counter()
        for _ in range(generations):
            noise = rng.standard_normal((population, tasks.ES_DIM))
            fitness = np.array(pool.run_all([(tasks.es_fitness, (theta + 0.1 * eps, iters))
                                             for eps in noise]))
            ranks = (fitness - fitness.mean()) / (fitness.std() + 1e-8)
            theta = theta + 0.01 / (population * 0.1) * noise.T @ ranks
        ideal = generations * population * task_s / WORKERS
        report["es_efficiency"] = ideal / (time.perf_counter() - start)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    parser.add_argument("--calls", type=int, default=500, help="task calls a run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    iters, task_s = tasks.calibrate_es()
    runs: dict[str, Any] = {"es": [], "sleep": [], "skeleton": []}
    for _ in range(args.repeat):
        runs["es"].append(es_ceiling(iters, args.calls))
        runs["sleep"].append(sleep_ceiling(args.calls))
        runs["skeleton"].append(skeleton_ceiling(iters, task_s))
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average_before": load,
        "workers": WORKERS, "es_iters": iters, "es_task_s": task_s,
        "es_efficiency_median": statistics.median(r["efficiency"] for r in runs["es"]),
        "sleep_efficiency_median": statistics.median(r["efficiency"] for r in runs["sleep"]),
        "skeleton_median": {key: statistics.median(r[key] for r in runs["skeleton"])
                            for key in runs["skeleton"][0]},
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
