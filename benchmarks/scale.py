"""Many real local workers: ``python -m benchmarks.scale --workers 64,256 [--quick]``.

For each worker count N (64, 256, 512 or 1024, chosen with ``--workers``; default 64,256)
and each system: `FiberExecutor(N)`, the stdlib's `ProcessPoolExecutor(N)` with the ``fork``
and with the ``spawn`` context, and loky's `get_reusable_executor(N)`. Each configuration
runs in a fresh process with a hard timeout, after which its process group, descendants and
any process carrying its token are killed (`benchmarks.fresh`). The systems alternate within
each N. Measured:

(a) **all N running**: seconds from just before the constructor until N distinct worker pids
    have returned a task; and how long the first ``submit`` took (the pool starts behind
    it, in the background). 4N tasks of ``time.sleep(0.05)`` that return ``os.getpid()`` are
    submitted at once, and N more whenever fewer than N are outstanding and some worker has
    not been seen yet, so that late workers still find work.
(b) **efficiency**: 20N tasks (quick 10N) of 50 ms on the warm pool; ideal = 20 x 50 ms
    (quick 10 x 50 ms); efficiency = ideal / elapsed.
(c) **peak workers alive**: the most distinct worker pids alive at once (sampled every 0.5 s
    among the pids seen so far, and once more at the end).
(d) **memory**: the USS of the executor's process, and the mean USS of its workers
    (psutil ``memory_full_info().uss``; at most 128 workers, evenly picked, are read).
(e) for fiberexec, ``stats().workers_lost`` and ``stats().tasks_retried`` at the end.
(f) **idle CPU**: with every task done, the machine's CPU use (``/proc/stat``: user, nice
    and system time of every process and the kernel's own threads, 100 = one core busy)
    over `IDLE_WINDOW` seconds after `IDLE_SETTLE`: what N idle workers and their executor
    cost a machine that has other work to do. The kernel's share (its memory monitor
    scans every process's pages) is there for every system alike.

The task is ``benchmarks.scale_tasks.sleep_pid``, from a module every worker imports, or with
``--task script`` the same function defined in the program that runs the executor (here, this
module run with ``-m``: its ``__main__``), as a researcher's script defines its own: fiberexec
and loky send it by value, the stdlib's pool by reference to ``__main__``; with ``--task numpy``
the same function in a module that imports numpy (``benchmarks.scale_numpy_tasks``), as a
researcher's module of tasks usually does: each worker needs numpy to load it.

Targets (read at N = 512, shown for every N): all N running, the time to all N running
<= 2x the stdlib's (fork, its default on Linux), efficiency >= the stdlib's (fork), no
worker lost and no task retried, the first ``submit`` back within 10 ms, and idle CPU at
most the stdlib's (fork) plus `IDLE_MARGIN` points.
Prints a markdown table and writes ``benchmarks/scale.json``.

Memory: every worker is a Python process; 1024 of them take several GiB (see the USS
columns of a smaller run). A configuration is skipped, with a message, when the machine's
available memory is below N x ``--mib-per-worker`` (default 20).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ("fiberexec", "stdlib-fork", "stdlib-spawn", "loky")
TASKS = ("module", "script", "numpy")
SIZES = (64, 256, 512, 1024)
TASK_S = 0.05
REFERENCE = "stdlib-fork"
FIRST_SUBMIT_MS = 10.0  # the first submit returns within this whatever N is
MEMORY_SAMPLE = 128
IDLE_SETTLE = 1.0  # seconds after the last task before idle CPU is measured
IDLE_WINDOW = 5.0  # seconds it is measured over
IDLE_MARGIN = 5.0  # points of one core fiberexec's idle workers may cost over the stdlib's

Metrics = dict[str, Any]


# ---------------------------------------------------------------- one configuration, fresh process


def make(system: str, n: int) -> Any:
    """The executor under test, with ``n`` workers."""
    if system == "fiberexec":
        from fiberexec import FiberExecutor

        return FiberExecutor(n)
    if system in ("stdlib-fork", "stdlib-spawn"):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context(system.split("-")[1])
        return ProcessPoolExecutor(n, mp_context=context)
    if system == "loky":
        from loky import get_reusable_executor

        # an idle worker stays for the whole run (loky's default lets it go after 10 s)
        return get_reusable_executor(max_workers=n, timeout=600)
    raise ValueError(f"system must be one of {', '.join(SYSTEMS)}, got {system!r}")


def preload(system: str) -> None:
    """Import what `make` needs, so that the timed construction does not count imports."""
    if system == "fiberexec":
        from benchmarks import systems

        systems.preload("fiberexec")
    elif system == "loky":
        import loky  # noqa: F401
    else:
        import concurrent.futures.process  # noqa: F401


class Tracker:
    """Collects task results on the executor's threads: pids seen, count finished."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.pids: set[int] = set()
        self.submitted = 0
        self.finished = 0
        self.failed: list[str] = []
        self.all_seen_at: float | None = None
        self.all_seen = threading.Event()
        self.drained = threading.Event()

    def add(self, future: Future[int]) -> None:
        with self.lock:
            self.submitted += 1
            self.drained.clear()
        future.add_done_callback(self._done)

    def _done(self, future: Future[int]) -> None:
        error = future.exception()
        with self.lock:
            self.finished += 1
            if error is not None:
                self.failed.append(f"{type(error).__name__}: {error}")
            else:
                self.pids.add(future.result())
                if len(self.pids) >= self.n and self.all_seen_at is None:
                    self.all_seen_at = time.perf_counter()
                    self.all_seen.set()
            if self.finished == self.submitted:
                self.drained.set()

    def outstanding(self) -> int:
        with self.lock:
            return self.submitted - self.finished

    def seen(self) -> list[int]:
        with self.lock:
            return list(self.pids)


class AliveSampler(threading.Thread):
    """Every 0.5 s, how many of the pids seen so far are alive; keeps the peak."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(daemon=True)
        self.tracker = tracker
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak = max(self.peak, sum(map(_exists, self.tracker.seen())))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive_not_zombie(pids: list[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


def _mean_uss(pids: list[int]) -> tuple[float | None, int]:
    import psutil

    step = max(1, len(pids) // MEMORY_SAMPLE)
    values = []
    for pid in sorted(pids)[::step][:MEMORY_SAMPLE]:
        try:
            values.append(psutil.Process(pid).memory_full_info().uss)
        except psutil.Error:
            continue
    return (sum(values) / len(values) / 2**20 if values else None), len(values)


def raise_nofile_limit() -> None:
    """Every system gets the hard open-files limit (fiberexec raises its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def script_sleep_pid(seconds: float) -> int:
    """`benchmarks.scale_tasks.sleep_pid`, defined in the running program (``--task script``)."""
    time.sleep(seconds)
    return os.getpid()


def task_function(kind: str) -> Callable[[float], int]:
    if kind == "module":
        from benchmarks.scale_tasks import sleep_pid

        return sleep_pid
    if kind == "script":
        if __name__ != "__main__":  # then it would be sent by reference, as the module's is
            raise RuntimeError("--task script needs this module to be the program run")
        return script_sleep_pid
    if kind == "numpy":
        from benchmarks import scale_numpy_tasks

        return scale_numpy_tasks.sleep_pid
    raise ValueError(f"task must be one of {', '.join(TASKS)}, got {kind!r}")


def measure_one(system: str, n: int, rounds: int, limit: float, task: str = "module") -> Metrics:
    """Phases (a) to (e) for one system and ``n`` workers; ``limit`` bounds phases a and b."""
    raise_nofile_limit()
    sleep_pid = task_function(task)
    preload(system)
    tracker = Tracker(n)
    sampler = AliveSampler(tracker)
    metrics: Metrics = {"system": system, "workers": n, "rounds": rounds}
    start = time.perf_counter()
    deadline = time.monotonic() + limit / 2
    ex = make(system, n)
    try:
        sampler.start()
        metrics.update(_until_all_running(ex, sleep_pid, tracker, start, deadline))
        if metrics["all_running"]:  # (b) only on a pool whose workers all run
            metrics.update(_efficiency(ex, sleep_pid, tracker, rounds, limit / 2))
            metrics["idle_cpu_pct"] = _idle_cpu()
        sampler.stop.set()
        metrics.update(_at_end(ex, tracker, sampler.peak))
    finally:
        sampler.stop.set()
        began = time.perf_counter()
        ex.shutdown(wait=True)
        metrics["shutdown_s"] = time.perf_counter() - began
    return metrics


def _until_all_running(ex: Any, sleep_pid: Callable[[float], int], tracker: Tracker,
                       start: float, deadline: float) -> Metrics:
    """(a): submit 4N tasks, top up while some worker is unseen; wait for them all."""
    n = tracker.n
    began = time.perf_counter()
    tracker.add(ex.submit(sleep_pid, TASK_S))  # the pool starts: this must not wait for it
    first_submit = time.perf_counter() - began
    for _ in range(4 * n - 1):
        tracker.add(ex.submit(sleep_pid, TASK_S))
    while not tracker.all_seen.wait(0.2) and time.monotonic() < deadline:
        if tracker.outstanding() < n:  # keep work queued until every worker has shown up
            for _ in range(n):
                tracker.add(ex.submit(sleep_pid, TASK_S))
    at = tracker.all_seen_at
    seen = len(tracker.seen())
    if not tracker.drained.wait(max(1.0, deadline - time.monotonic() + 60)):
        raise TimeoutError(f"{tracker.outstanding()} start-up tasks unfinished")
    return {"all_running": at is not None, "all_running_s": None if at is None else at - start,
            "distinct_at_start": seen, "first_submit_ms": first_submit * 1000}


def _efficiency(ex: Any, sleep_pid: Callable[[float], int], tracker: Tracker, rounds: int,
                timeout: float) -> Metrics:
    """(b): ``rounds`` x N tasks of `TASK_S` on the warm pool, against the ideal time."""
    before = set(tracker.seen())
    began = time.perf_counter()
    for _ in range(rounds * tracker.n):
        tracker.add(ex.submit(sleep_pid, TASK_S))
    if not tracker.drained.wait(timeout):
        raise TimeoutError(f"{tracker.outstanding()} of {rounds * tracker.n} tasks unfinished "
                           f"after {timeout:.0f}s")
    elapsed = time.perf_counter() - began
    return {"efficiency": rounds * TASK_S / elapsed, "elapsed_s": elapsed,
            "new_pids_in_run": len(set(tracker.seen()) - before)}


def _machine_cpu() -> float:
    """Seconds of CPU the machine has used since boot (user, nice, system: every process
    and the kernel's threads), from ``/proc/stat``."""
    with open("/proc/stat") as f:
        user, nice, system = (int(v) for v in f.readline().split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def _idle_cpu() -> float:
    """(f): the machine's CPU use, in percent of one core, while the pool idles."""
    time.sleep(IDLE_SETTLE)
    cpu, began = _machine_cpu(), time.monotonic()
    time.sleep(IDLE_WINDOW)
    return 100 * (_machine_cpu() - cpu) / (time.monotonic() - began)


def _at_end(ex: Any, tracker: Tracker, peak: int) -> Metrics:
    """(c), (d) and (e): workers alive, memory, and fiberexec's own count of losses."""
    import psutil

    alive = _alive_not_zombie(tracker.seen())
    metrics: Metrics = {"alive_at_end": len(alive), "peak_alive": max(peak, len(alive)),
                        "distinct_pids": len(tracker.seen()), "tasks_failed": len(tracker.failed),
                        "executor_uss_mib": psutil.Process().memory_full_info().uss / 2**20}
    if tracker.failed:
        metrics["first_failure"] = tracker.failed[0][:300]
    metrics["worker_uss_mib"], metrics["uss_sampled"] = _mean_uss(alive)
    if hasattr(ex, "stats"):
        stats = ex.stats()
        metrics["workers_lost"] = stats.workers_lost
        metrics["tasks_retried"] = stats.tasks_retried
    return metrics


# ---------------------------------------------------------------- the runner


def verdict(by: dict[str, Metrics]) -> str:
    """fiberexec against the stdlib (fork) at one N."""
    ours, ref = by.get("fiberexec"), by.get(REFERENCE)
    if not ours or "error" in ours or "skipped" in ours:
        return "not measured"
    runs = ours.get("runs", [ours])  # (the median run's figures; every run must have all)
    short = [m for m in runs if "error" in m or not m.get("all_running")]
    if short:
        return f"falls short (not all running in {len(short)} of {len(runs)} runs)"
    if not ref or "error" in ref or "skipped" in ref or not ref.get("all_running"):
        return f"all running; {REFERENCE} not measured"
    quick_enough = ours["all_running_s"] <= 2 * ref["all_running_s"]
    efficient = ours.get("efficiency", 0.0) >= ref.get("efficiency", float("inf"))
    clean = not ours.get("workers_lost") and not ours.get("tasks_retried")
    prompt = ours.get("first_submit_ms", 0.0) < FIRST_SUBMIT_MS
    quiet = ours.get("idle_cpu_pct", 0.0) <= ref.get("idle_cpu_pct", 0.0) + IDLE_MARGIN
    return ("holds" if quick_enough and efficient and clean and prompt and quiet
            else "falls short")


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict[int, dict[str, Metrics]]) -> str:
    lines = [
        "| N | system | first submit, ms | all N ran a task, s | efficiency | peak alive "
        "| executor USS, MiB | worker USS, MiB | lost / retried | idle CPU, % of a core "
        "| shutdown, s | verdict (fiberexec) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, by in results.items():
        judged = verdict(by)
        for system, m in by.items():
            mark = judged if system == "fiberexec" else ""
            if "skipped" in m or "error" in m:
                why = m.get("skipped") or f"error: {m['error']}"
                lines.append(f"| {n} | {system} | {why[:90]} | | | | | | | | | {mark} |")
                continue
            running = (f"{m['all_running_s']:.2f}" if m["all_running"]
                       else f"not all: {m['distinct_at_start']} of {n}")
            lost = (f"{m['workers_lost']} / {m['tasks_retried']}"
                    if "workers_lost" in m else "-")
            lines.append(
                f"| {n} | {system} | {_fmt(m.get('first_submit_ms'), '.1f')} | {running} "
                f"| {_fmt(m.get('efficiency'), '.2f')} "
                f"| {m['peak_alive']} | {_fmt(m.get('executor_uss_mib'), '.1f')} "
                f"| {_fmt(m.get('worker_uss_mib'), '.1f')} | {lost} "
                f"| {_fmt(m.get('idle_cpu_pct'), '.1f')} "
                f"| {_fmt(m.get('shutdown_s'), '.2f')} | {mark} |")
    return "\n".join(lines)


def _available_mib() -> float:
    import psutil

    return float(psutil.virtual_memory().available / 2**20)


def run(options: argparse.Namespace) -> tuple[dict[int, dict[str, Metrics]], dict[str, Any]]:
    from benchmarks import fresh

    sizes = [int(s) for s in options.workers.split(",")]
    systems = options.systems.split(",") if options.systems else list(SYSTEMS)
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    rounds = 10 if options.quick else 20
    timeout = options.timeout or (180.0 if options.quick else 900.0)
    started, load_before = time.monotonic(), os.getloadavg()
    samples: dict[tuple[int, str], list[Metrics]] = {}
    for n in sizes:
        for r in range(options.repeat):
            shift = r % len(systems)
            for system in systems[shift:] + systems[:shift]:  # a different first each repeat
                need = n * options.mib_per_worker
                if _available_mib() < need:
                    metrics: Metrics = {"skipped": f"needs about {need:.0f} MiB free, "
                                                   f"{_available_mib():.0f} available"}
                else:
                    began = time.monotonic()
                    metrics = fresh.run("benchmarks.scale",
                                        ["--one", system, str(n), str(rounds),
                                         str(timeout * 0.8), "--task", options.task], timeout)
                    metrics["wall_s"] = time.monotonic() - began
                samples.setdefault((n, system), []).append(metrics)
                print(f"  [{r + 1}/{options.repeat}] N={n:<5} {system:<13} {_brief(metrics)}",
                      file=sys.stderr, flush=True)
    results: dict[int, dict[str, Metrics]] = {}
    for (n, system), runs in samples.items():
        results.setdefault(n, {})[system] = _median(runs)
    meta = {
        "mode": "quick" if options.quick else "full", "repeat": options.repeat,
        "task": options.task,
        "rounds": rounds, "task_s": TASK_S, "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.platform(),
        "seconds": round(time.monotonic() - started, 1),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return results, meta


def _median(runs: list[Metrics]) -> Metrics:
    """The run with the median time to all running (all runs are kept in ``runs``)."""
    good = [m for m in runs if "error" not in m and "skipped" not in m]
    if not good:
        return {**runs[-1], "runs": runs}
    good.sort(key=lambda m: (not m["all_running"], m.get("all_running_s") or 0.0))
    return {**good[len(good) // 2], "runs": runs} if len(runs) > 1 else good[0]


def _brief(metrics: Metrics) -> str:
    if "error" in metrics:
        return f"ERROR {metrics['error'][:150]}"
    if "skipped" in metrics:
        return f"SKIPPED {metrics['skipped']}"
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in metrics.items() if k not in ("system", "first_failure"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="64,256",
                        help=f"comma-separated worker counts, from {','.join(map(str, SIZES))}")
    parser.add_argument("--systems", default="", help=f"subset of {','.join(SYSTEMS)}")
    parser.add_argument("--quick", action="store_true", help="10N instead of 20N tasks in (b)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds one configuration may take (900; quick 180)")
    parser.add_argument("--mib-per-worker", type=float, default=20.0,
                        help="skip N workers unless N x this much memory is available")
    parser.add_argument("--task", choices=TASKS, default="module",
                        help="the task's function: from a module (default), defined in the "
                             "program that runs the executor (sent by value), or from a "
                             "module that imports numpy")
    parser.add_argument("--output", type=Path, default=HERE / "scale.json")
    parser.add_argument("--one", nargs=4, metavar=("SYSTEM", "N", "ROUNDS", "LIMIT"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        from benchmarks.measure import report

        system, n, rounds, limit = options.one
        return report(lambda: measure_one(system, int(n), int(rounds), float(limit),
                                          options.task))
    results, meta = run(options)
    print(table(results))
    print(f"\n{meta['mode']} run, task from the {meta['task']}, {meta['repeat']} repeat(s), "
          f"{meta['seconds']}s, "
          f"load average {meta['load_average_before'][0]:.2f} before, "
          f"{meta['load_average_after'][0]:.2f} after")
    verdicts = {str(n): verdict(by) for n, by in results.items()}
    options.output.write_text(json.dumps(
        {"meta": meta, "results": {str(n): by for n, by in results.items()},
         "verdicts": verdicts}, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
