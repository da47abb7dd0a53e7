"""The workloads. Each takes a system's name and the run's sizes and returns its metrics.

Every workload builds its own system, warms it up where the workload is about steady state,
and bounds every wait with a timeout.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import systems, tasks

WORKERS = 2
TIMEOUT = 300.0  # seconds any single wait may take before the measurement is abandoned

#: Sizes of the full run; ``--quick`` uses `QUICK` instead.
FULL: dict[str, int] = {
    "submit_n": 20_000,
    "map_n": 200_000,
    "barrier_n": 64,
    "barrier_rounds": 20,
    "rounds_n_rounds": 500,
    "small_maps": 300,
    "burst_n": 2000,
    "latency_n": 2000,
    "latency_warmup": 200,
    "remake_n": 20,
    "array_n": 20,
    "objects_n": 8,
    "es_population": 256,
    "es_generations": 5,
    "matmul_n": 200,
    "sim_workers": 1024,
    "sim_tasks": 200_000,
}
QUICK: dict[str, int] = {
    **FULL,
    "submit_n": 5000,
    "map_n": 50_000,
    "barrier_rounds": 5,
    "rounds_n_rounds": 150,
    "small_maps": 100,
    "burst_n": 500,
    "latency_n": 500,
    "latency_warmup": 50,
    "remake_n": 6,
    "array_n": 5,
    "objects_n": 3,
    "es_population": 64,
    "es_generations": 2,
    "matmul_n": 60,
    "sim_tasks": 50_000,
}

Metrics = dict[str, Any]
System = systems.FuturesSystem | systems.PoolSystem


def _warm(system: System) -> None:
    system.wait_all([system.submit(tasks.noop) for _ in range(8 * WORKERS)], TIMEOUT)


def _timed(system: System, body: Callable[[System], None]) -> float:
    start = time.perf_counter()
    body(system)
    return time.perf_counter() - start


def _with_warm_system(name: str, body: Callable[[System], Metrics]) -> Metrics:
    system = systems.make(name, WORKERS)
    try:
        _warm(system)
        return body(system)
    finally:
        system.close()


def submit_throughput(name: str, sizes: dict[str, int]) -> Metrics:
    n = sizes["submit_n"]

    def body(system: System) -> Metrics:
        elapsed = _timed(system, lambda s: s.wait_all([s.submit(tasks.noop) for _ in range(n)],
                                                      TIMEOUT))
        return {"tasks_per_s": n / elapsed, "n": n}

    return _with_warm_system(name, body)


def map_throughput(name: str, sizes: dict[str, int]) -> Metrics:
    n = sizes["map_n"]
    chunksize = math.ceil(n / (4 * WORKERS))

    def body(system: System) -> Metrics:
        count = 0

        def run(s: System) -> None:
            nonlocal count
            count = s.map(tasks.noop, range(n), chunksize, TIMEOUT)

        elapsed = _timed(system, run)
        if count != n:
            raise RuntimeError(f"map returned {count} results for {n} items")
        return {"tasks_per_s": n / elapsed, "n": n, "chunksize": chunksize}

    return _with_warm_system(name, body)


SMALL_MAP_ITEMS = 16  # emcee's: a map over half of 32 walkers, twice a step
SMALL_MAP_TASK = 0.0004  # seconds of CPU an item takes


def small_maps(name: str, sizes: dict[str, int]) -> Metrics:
    """What emcee, SciPy's differential evolution and DEAP do: one map after another of a
    few short CPU-bound items (16 of 0.4 ms here, in chunks of 2: `mp.Pool`'s default for 16
    items on 2 workers), each map waited for before the next. Every map pays its start and
    its slowest worker's end, so how evenly a map's items spread shows."""
    maps = sizes["small_maps"]
    items = [SMALL_MAP_TASK] * SMALL_MAP_ITEMS

    def body(system: System) -> Metrics:
        def run(s: System) -> None:
            for _ in range(maps):
                s.map(tasks.spin, items, 2, TIMEOUT)

        elapsed = _timed(system, run)
        ideal = maps * SMALL_MAP_ITEMS * SMALL_MAP_TASK / WORKERS
        return {"efficiency": ideal / elapsed, "elapsed_s": elapsed, "maps": maps,
                "map_ms": 1000 * elapsed / maps}

    return _with_warm_system(name, body)


def _rounds(name: str, n: int, rounds: int) -> Metrics:
    """``rounds`` rounds of ``n`` 1 ms tasks: each round submits all ``n`` and waits for them."""

    def body(system: System) -> Metrics:
        def run(s: System) -> None:
            for _ in range(rounds):
                s.wait_all([s.submit(tasks.sleep_1ms) for _ in range(n)], TIMEOUT)

        elapsed = _timed(system, run)
        ideal = rounds * n * 0.001 / WORKERS
        return {"efficiency": ideal / elapsed, "elapsed_s": elapsed, "n": n, "rounds": rounds}

    return _with_warm_system(name, body)


def barrier_rounds(name: str, sizes: dict[str, int]) -> Metrics:
    return _rounds(name, sizes["barrier_n"], sizes["barrier_rounds"])


def rounds_of_workers(name: str, sizes: dict[str, int]) -> Metrics:
    """The Fiber paper's test: rounds of N = workers 1 ms tasks, each round waited for.

    With one task per worker per round, no queued task hides a round trip: every round
    costs the slowest of N dispatches, runs and replies.
    """
    return _rounds(name, WORKERS, sizes["rounds_n_rounds"])


def burst(name: str, sizes: dict[str, int]) -> Metrics:
    n = sizes["burst_n"]

    def body(system: System) -> Metrics:
        elapsed = _timed(system, lambda s: s.wait_all([s.submit(tasks.sleep_1ms)
                                                       for _ in range(n)], TIMEOUT))
        ideal = n * 0.001 / WORKERS
        return {"efficiency": ideal / elapsed, "elapsed_s": elapsed, "n": n}

    return _with_warm_system(name, body)


def latency(name: str, sizes: dict[str, int]) -> Metrics:
    n, warmup = sizes["latency_n"], sizes["latency_warmup"]

    def body(system: System) -> Metrics:
        samples = []
        for i in range(warmup + n):
            start = time.perf_counter_ns()
            system.result(system.submit(tasks.noop), TIMEOUT)
            if i >= warmup:
                samples.append((time.perf_counter_ns() - start) / 1000)
        samples.sort()
        return {"p50_us": percentile(samples, 50), "p99_us": percentile(samples, 99), "n": n}

    return _with_warm_system(name, body)


def percentile(sorted_values: list[float], pct: float) -> float:
    """The nearest-rank ``pct`` percentile of values sorted in ascending order."""
    index = min(len(sorted_values) - 1, max(0, math.ceil(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


def array_transfer(name: str, sizes: dict[str, int]) -> Metrics:
    arr = np.ones(tasks.ARRAY_BYTES, dtype=np.uint8)
    return _both_ways(name, sizes["array_n"], arr, tasks.ARRAY_BYTES / 2**20,
                      tasks.array_nbytes, tasks.cached_array, lambda a: a.nbytes)


def object_transfer(name: str, sizes: dict[str, int]) -> Metrics:
    """A list of 1,000,000 short strings (an 18 MiB pickle stream, no buffers) to a task and
    back: what a rollout's records cost to move, where an array costs one copy."""
    import pickle

    rows = tasks.object_rows()
    return _both_ways(name, sizes["objects_n"], rows, len(pickle.dumps(rows, protocol=5)) / 2**20,
                      tasks.count_rows, tasks.cached_rows, len)


def _both_ways(  # noqa: PLR0917  # one transfer, described
        name: str, n: int, data: Any, mib: float, size_in_task: Callable[[Any], int],
        cached: Callable[[], Any], size: Callable[[Any], int]) -> Metrics:
    """MiB/s of ``data`` (``mib`` of it) sent to a task ``n`` times (which returns its
    ``size``), and of a copy each worker builds once and keeps (``cached``) returned ``n``
    times, one transfer at a time, after a warm-up."""
    expected = size(data)

    def body(system: System) -> Metrics:
        for _ in range(2):  # warm-up: each worker has built its copy, paths are hot
            system.result(system.submit(size_in_task, data), TIMEOUT)
            system.wait_all([system.submit(cached) for _ in range(WORKERS)], TIMEOUT)

        def send(s: System) -> None:
            for _ in range(n):
                if s.result(s.submit(size_in_task, data), TIMEOUT) != expected:
                    raise RuntimeError("the task saw data of another size")

        def fetch(s: System) -> None:
            for _ in range(n):
                if size(s.result(s.submit(cached), TIMEOUT)) != expected:
                    raise RuntimeError("the task returned data of another size")

        to_s, from_s = _timed(system, send), _timed(system, fetch)
        return {"to_mib_s": n * mib / to_s, "from_mib_s": n * mib / from_s, "n": n}

    return _with_warm_system(name, body)


def first_result(name: str, sizes: dict[str, int]) -> Metrics:
    systems.preload(name)
    start = time.perf_counter()
    system = systems.make(name, WORKERS)
    try:
        system.result(system.submit(tasks.noop), TIMEOUT)
        elapsed = time.perf_counter() - start
    finally:
        system.close()
    return {"seconds": elapsed, "start_method": systems.start_method(name)}


def remake(name: str, sizes: dict[str, int]) -> Metrics:
    """Executors made one after another, as a program that makes a pool per generation
    does: construct, 8 no-op tasks, shut down; the median of ``remake_n`` (the first, which
    starts what later ones reuse, reported apart)."""
    systems.preload(name)
    times = []
    for _ in range(sizes["remake_n"]):
        start = time.perf_counter()
        system = systems.make(name, WORKERS)
        try:
            system.wait_all([system.submit(tasks.noop) for _ in range(8)], TIMEOUT)
        finally:
            system.close()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "first_s": times[0], "n": len(times)}


def shutdown_time(name: str, sizes: dict[str, int]) -> Metrics:
    system = systems.make(name, WORKERS)
    try:
        _warm(system)
        system.wait_all([system.submit(tasks.noop) for _ in range(100)], TIMEOUT)
    except BaseException:
        system.close()
        raise
    return {"seconds": _timed(system, lambda s: s.close())}


def es_generation(name: str, sizes: dict[str, int], iters: int, task_s: float = 0.0) -> Metrics:
    """Evolution strategies: evaluate a population of perturbations, update, repeat.

    The ideal's unit is ``task_s``, one call's time as the run's calibration measured it,
    the same for every system; this process's own timing of one call (``task_s_here``,
    ``efficiency_own``) is kept beside it: it moved by a fifth between processes of one
    run, which decided the comparison when each system was judged by its own."""
    population, generations = sizes["es_population"], sizes["es_generations"]
    rng = np.random.default_rng(0)
    theta = np.zeros(tasks.ES_DIM)
    here = tasks.time_es(theta, iters, 30)  # this core, this moment
    single = task_s or here

    def body(system: System) -> Metrics:
        nonlocal theta

        system.wait_all([system.submit(tasks.es_fitness, theta, iters)
                         for _ in range(2 * WORKERS)], TIMEOUT)  # workers build the matrix

        def run(s: System) -> None:
            nonlocal theta
            for _ in range(generations):
                noise = rng.standard_normal((population, tasks.ES_DIM))
                handles = [s.submit(tasks.es_fitness, theta + 0.1 * eps, iters) for eps in noise]
                fitness = np.array([s.result(h, TIMEOUT) for h in handles])
                ranks = (fitness - fitness.mean()) / (fitness.std() + 1e-8)
                theta = theta + 0.01 / (population * 0.1) * noise.T @ ranks

        elapsed = _timed(system, run)
        ideal = generations * population * single / WORKERS
        return {"efficiency": ideal / elapsed, "elapsed_s": elapsed, "task_s": single,
                "task_s_here": here,
                "efficiency_own": generations * population * here / WORKERS / elapsed,
                "iters": iters, "population": population, "generations": generations}

    return _with_warm_system(name, body)


def es_large_vector(name: str, sizes: dict[str, int]) -> Metrics:
    """ES with an 8 MB parameter vector every task reads: 64 tasks a generation, updated in
    place between generations. What it measures is moving the vector to the workers."""
    population, generations = 64, sizes["es_generations"]
    theta = np.zeros(1 << 20)  # 8 MiB of float64

    def body(system: System) -> Metrics:
        def run(s: System) -> None:
            for generation in range(generations):
                handles = [s.submit(tasks.es_sampled_fitness, theta, generation * population + i)
                           for i in range(population)]
                fitness = np.array([s.result(h, TIMEOUT) for h in handles])
                theta[: fitness.size] += 0.01 * (fitness - fitness.mean())
                np.add(theta, 1e-3, out=theta)  # every generation a new vector, in place

        elapsed = _timed(system, run)
        metrics: Metrics = {"elapsed_s": elapsed, "generations": generations,
                            "population": population, "vector_mib": theta.nbytes / 2**20}
        stats = getattr(getattr(system, "executor", None), "stats", None)
        if stats is not None:  # fiberexec: what crossed to the workers, per generation
            sent = stats().args_kept_bytes / generations
            metrics["vector_mib_sent_per_generation"] = sent / 2**20
        return metrics

    return _with_warm_system(name, body)


def matmul_tasks(name: str, sizes: dict[str, int]) -> Metrics:
    """Tasks of numpy matrix products, every process as a program starts it (no thread
    variables set, see `benchmarks.run.OWN_THREADS`): how many BLAS threads each system's
    workers start decides it."""
    n = sizes["matmul_n"]

    def body(system: System) -> Metrics:
        system.wait_all([system.submit(tasks.matmul, i) for i in range(2 * WORKERS)], TIMEOUT)
        elapsed = _timed(system, lambda s: s.wait_all([s.submit(tasks.matmul, i)
                                                       for i in range(n)], TIMEOUT))
        return {"seconds": elapsed, "n": n, "task_ms": 1000 * elapsed * WORKERS / n}

    return _with_warm_system(name, body)


WORKLOADS: dict[str, Callable[..., Metrics]] = {
    "submit": submit_throughput,
    "map": map_throughput,
    "barrier": barrier_rounds,
    "rounds_n": rounds_of_workers,
    "small_maps": small_maps,
    "burst": burst,
    "latency": latency,
    "array": array_transfer,
    "objects": object_transfer,
    "first_result": first_result,
    "remake": remake,
    "shutdown": shutdown_time,
    "es": es_generation,
    "es_8mb": es_large_vector,
    "matmul": matmul_tasks,
}


def simulated_dispatch(name: str, sizes: dict[str, int], shards: int,
                       link: str = "unix") -> Metrics:
    """fiberexec only: connect many simulated workers, then time a flood of no-op tasks."""
    from concurrent.futures import wait as wait_futures

    from benchmarks.simulated import SimulatedBackend, raise_nofile_limit
    from fiberexec import FiberExecutor

    if name != "fiberexec":
        raise ValueError("the simulated-workers workload runs on fiberexec only")
    raise_nofile_limit()
    workers, n = sizes["sim_workers"], sizes["sim_tasks"]
    backend = SimulatedBackend(link=link)
    with backend:
        start = time.perf_counter()
        ex = FiberExecutor(max_workers=workers, backend=backend, shards=shards, heartbeat=5)
        try:
            ex.submit(tasks.noop).result(timeout=120)  # the first submit starts every worker
            if not backend.wait_ready(workers, timeout=120):
                raise TimeoutError(f"only {backend.ready_count} of {workers} simulated workers "
                                   "connected within 120s")
            connected = _await_workers(ex, workers, timeout=10)
            connect_s = time.perf_counter() - start
            idle_ms = _snapshot_ms(ex, workers)
            sim_cpu, own_cpu = backend.simulator_cpu(), time.process_time()
            begin = time.perf_counter()
            futures = [ex.submit(tasks.noop) for _ in range(n)]
            submitted = time.perf_counter() - begin
            busy_ms = _snapshot_ms(ex, workers)  # while the flood is dispatched
            _, pending = wait_futures(futures, timeout=TIMEOUT)
            elapsed = time.perf_counter() - begin
            if pending:
                raise TimeoutError(f"{len(pending)} of {n} tasks unfinished after {TIMEOUT}s")
            sim_cpu = backend.simulator_cpu() - sim_cpu
            own_cpu = time.process_time() - own_cpu
            stats = ex.stats()
        finally:
            ex.shutdown(wait=True)
    return {"tasks_per_s": n / elapsed, "connect_s": connect_s, "workers": connected,
            "submit_s": submitted, "n": n, "shards": shards, "link": link,
            "tasks_done": stats.tasks_done,
            "dispatch_s": elapsed, "workers_idle_ms": idle_ms, "workers_busy_ms": busy_ms,
            # CPU seconds per second of dispatch: near 1.0 means that process was the limit
            "simulator_busy": sim_cpu / elapsed, "executor_busy": own_cpu / elapsed}


def output_forwarding(name: str, sizes: dict[str, int], rounds: int = 7) -> Metrics:
    """fiberexec only: no-op dispatch while another task prints 10 MiB to its stdout,
    forwarded (``output="forward"``, written to /dev/null here), against the same while
    that task prints the same lines to /dev/null itself (the worker does the same work,
    nothing is forwarded). Both in one executor, ``rounds`` times, which goes first
    alternating. ``slowdown`` compares the executor process's CPU time per task (what
    dispatch costs it, and what receiving and writing the output adds), which a busy
    machine disturbs less than the wall time (also reported): the median of the rounds'
    ratios. Within one executor, because dispatch alone costs up to a third more in one
    executor than in the next, and the signal is a few per cent."""
    import contextlib
    import os
    from concurrent.futures import wait as wait_futures

    from fiberexec import FiberExecutor

    if name != "fiberexec":
        raise ValueError("the output workload runs on fiberexec only")
    n = sizes["submit_n"]
    rates: dict[bool, list[float]] = {True: [], False: []}  # by: is the output forwarded
    cpu: dict[bool, list[float]] = {True: [], False: []}
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        for round_ in range(rounds):
            with FiberExecutor(max_workers=WORKERS, output="forward") as ex:
                wait_futures([ex.submit(tasks.noop) for _ in range(8 * WORKERS)], TIMEOUT)
                for forwarded in (round_ % 2 == 0, round_ % 2 == 1):
                    begin, cpu_begin = time.perf_counter(), time.process_time()
                    printer = ex.submit(tasks.print_mib, 10, not forwarded)
                    _, pending = wait_futures([ex.submit(tasks.noop) for _ in range(n)],
                                              TIMEOUT)
                    rates[forwarded].append(n / (time.perf_counter() - begin))
                    printer.result(timeout=TIMEOUT)
                    ex.submit(tasks.noop).result(timeout=TIMEOUT)  # the output has arrived
                    cpu[forwarded].append((time.process_time() - cpu_begin) / n)
                    if pending:
                        raise TimeoutError(f"{len(pending)} of {n} tasks unfinished")

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    slowdowns = [f / o - 1 for o, f in zip(cpu[False], cpu[True], strict=True)]
    return {"silent_tasks_per_s": median(rates[False]),
            "forward_tasks_per_s": median(rates[True]), "n": n,
            "silent_cpu_us": 1e6 * median(cpu[False]),
            "forward_cpu_us": 1e6 * median(cpu[True]),
            "slowdown": median(slowdowns), "slowdowns": slowdowns,
            "wall_slowdown": median([1 - f / o for o, f in zip(rates[False], rates[True],
                                                                strict=True)])}


def _snapshot_ms(ex: Any, workers: int, times: int = 5) -> float:
    """The median time of ``ex.workers()``, milliseconds (each lists every worker)."""
    samples = []
    for _ in range(times):
        begin = time.perf_counter()
        infos = ex.workers()
        samples.append(1000 * (time.perf_counter() - begin))
        if len(infos) < workers:
            raise RuntimeError(f"workers() listed {len(infos)} of {workers} workers")
    return sorted(samples)[times // 2]


def _await_workers(ex: Any, workers: int, timeout: float) -> int:
    """``ex.stats().workers`` once it reaches ``workers`` (bounded: ``timeout`` seconds)."""
    import threading

    deadline = time.monotonic() + timeout
    tick = threading.Event()
    seen = ex.stats().workers
    while seen < workers and time.monotonic() < deadline:
        tick.wait(0.01)  # stats() has no change notification; a bounded, short re-check
        seen = ex.stats().workers
    if seen < workers:
        raise TimeoutError(f"stats().workers is {seen}, not {workers}, after {timeout}s")
    return int(seen)
