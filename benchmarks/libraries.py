"""Real libraries on the stdlib's pool and on fiberexec's: ``python -m benchmarks.libraries``.

Five small programs (`benchmarks.programs`) hand a process pool to a library: emcee's
`EnsembleSampler(pool=pool)`, SciPy's `differential_evolution(workers=pool.map)`,
Nevergrad's `optimizer.minimize(executor=ex)`, pymoo's `StarmapParallelization(pool.starmap)`
and DEAP's ``toolbox.register("map", pool.map)``. Each runs once on the standard library
(`multiprocessing.Pool(2)` or `ProcessPoolExecutor(2)`, whichever the library takes) and once
with the one line that picks fiberexec instead (``import fiberexec.multiprocessing as mp`` or
`FiberExecutor(2)`). Every run is a fresh process; the systems alternate within a repeat,
and each goes first in turn from one repeat to the next. The time is the wall time from just
before the pool's constructor to the library's result, so start-up counts.

A third system, for reference, is the standard library with the ``forkserver`` start method
(``mp.get_context("forkserver").Pool`` or ``ProcessPoolExecutor(mp_context=...)``), its
default on Linux from Python 3.14: like fiberexec it forks nothing from the user's process,
so its workers import the program's libraries themselves, where the default ``fork``'s
inherit them. The target is against the default (``fork`` on Python 3.11).

    python -m benchmarks.libraries              # median of 3, a few minutes
    python -m benchmarks.libraries --quick      # 1 repeat, smaller runs, about a minute
    python -m benchmarks.libraries --libraries emcee,scipy --repeat 5

Prints a markdown table (the ratio is fiberexec's time over the stdlib's; the target is
<= 1.1) and writes ``benchmarks/libraries.json``. A library that is not installed is skipped
with a message saying so (``pip install 'fiberexec[libraries]'`` installs them all).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ("stdlib", "fiberexec", "forkserver")
TARGET = 1.1  # fiberexec's time / the stdlib's (its default start method, fork)
#: library -> (the program's module in benchmarks.programs, the import name it needs)
LIBRARIES: dict[str, tuple[str, str]] = {
    "emcee": ("emcee_fit", "emcee"),
    "scipy": ("scipy_de", "scipy"),
    "nevergrad": ("nevergrad_opt", "nevergrad"),
    "pymoo": ("pymoo_nsga2", "pymoo"),
    "deap": ("deap_ga", "deap"),
}
#: How each program is handed its pool (for the table).
HOW = {
    "emcee": "`EnsembleSampler(..., pool=pool)`",
    "scipy": "`differential_evolution(..., workers=pool.map)`",
    "nevergrad": "`optimizer.minimize(f, executor=ex, batch_mode=False)`",
    "pymoo": "`StarmapParallelization(pool.starmap)`",
    "deap": "`toolbox.register(\"map\", pool.map)`",
}

Metrics = dict[str, Any]


# ---------------------------------------------------------------- one run, in a fresh process


def pool_for(kind: str, system: str) -> Any:
    """What the program builds its pool with: the one line that differs between the runs."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if system == "forkserver":
        context = multiprocessing.get_context("forkserver")
        return context if kind == "pool" else partial(ProcessPoolExecutor, mp_context=context)
    if kind == "pool":
        if system == "stdlib":
            return multiprocessing
        import fiberexec.multiprocessing as mp

        return mp
    if system == "stdlib":
        return ProcessPoolExecutor
    from fiberexec import FiberExecutor

    return FiberExecutor


def measure_one(library: str, system: str, size: str) -> Metrics:
    from benchmarks import systems
    from benchmarks.programs import WORKERS, model

    program = importlib.import_module(f"benchmarks.programs.{LIBRARIES[library][0]}")
    pool = pool_for(program.KIND, system)
    systems.preload(system)  # a user's imports come before the timed part; so do these
    eval_s = model.time_misfit()
    start = time.perf_counter()
    outcome = program.run(pool, size)
    total = time.perf_counter() - start
    ideal = outcome["evaluations"] * eval_s / WORKERS
    return {**outcome, "with_close_s": total, "eval_ms": eval_s * 1e3,
            "efficiency": ideal / outcome["seconds"], "kind": program.KIND}


# ---------------------------------------------------------------- the runner


def missing(library: str) -> str | None:
    """Why ``library`` cannot run here, or None."""
    name = LIBRARIES[library][1]
    if importlib.util.find_spec(name) is None:
        return f"{name} is not installed (pip install 'fiberexec[libraries]')"
    return None


def run(options: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    from benchmarks import fresh

    size = "quick" if options.quick else "full"
    repeat = options.repeat or (1 if options.quick else 3)
    timeout = options.timeout or (120.0 if options.quick else 300.0)
    chosen = options.libraries.split(",") if options.libraries else list(LIBRARIES)
    unknown = sorted(set(chosen) - set(LIBRARIES))
    if unknown:
        raise SystemExit(f"unknown libraries {unknown}; choose from {', '.join(LIBRARIES)}")
    results: dict[str, Any] = {}
    for library in chosen:
        reason = missing(library)
        if reason:
            print(f"  skipping {library}: {reason}", file=sys.stderr)
            results[library] = {"skipped": reason}
    runnable = [lib for lib in chosen if lib not in results]
    started, load_before = time.monotonic(), os.getloadavg()
    samples: dict[tuple[str, str], list[Metrics]] = {}
    for r in range(repeat):
        order = SYSTEMS[r % 3:] + SYSTEMS[:r % 3]  # each goes first in turn
        for library in runnable:
            for system in order:
                began = time.monotonic()
                metrics = fresh.run("benchmarks.libraries", ["--one", library, system, size],
                                    timeout)
                samples.setdefault((library, system), []).append(metrics)
                print(f"  [{r + 1}/{repeat}] {library:<10} {system:<10} "
                      f"{time.monotonic() - began:5.1f}s {_brief(metrics)}",
                      file=sys.stderr, flush=True)
    for library in runnable:
        results[library] = summarize([samples[(library, s)] for s in SYSTEMS])
    meta = {
        "mode": size, "repeat": repeat, "workers": 2, "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.platform(),
        "versions": {lib: _version(LIBRARIES[lib][1]) for lib in chosen},
        "seconds": round(time.monotonic() - started, 1),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return results, meta


def summarize(runs: list[list[Metrics]]) -> dict[str, Any]:
    """Medians per system, the ratio of the medians, and the ratio of each repeat's pair
    (fiberexec's time over the stdlib's; also over the forkserver's, for reference)."""
    stdlib, ours, forkserver = runs
    entry: dict[str, Any] = {"runs": dict(zip(SYSTEMS, runs, strict=True))}
    good = {name: [m for m in ms if "error" not in m] for name, ms in zip(SYSTEMS, runs,
                                                                         strict=True)}
    for name in SYSTEMS:
        if not good[name]:
            entry["error"] = f"{name}: {runs[SYSTEMS.index(name)][-1]['error']}"
            entry["verdict"] = "not measured"
            return entry
        entry[name] = {key: statistics.median(m[key] for m in good[name])
                       for key in ("seconds", "with_close_s", "eval_ms", "efficiency",
                                   "evaluations")}
    ratio = entry["fiberexec"]["seconds"] / entry["stdlib"]["seconds"]
    entry["ratio"] = ratio
    entry["ratios"] = [b["seconds"] / a["seconds"] for a, b in zip(stdlib, ours, strict=True)
                       if "error" not in a and "error" not in b]
    entry["ratio_forkserver"] = entry["fiberexec"]["seconds"] / entry["forkserver"]["seconds"]
    entry["ratios_forkserver"] = [b["seconds"] / a["seconds"]
                                  for a, b in zip(forkserver, ours, strict=True)
                                  if "error" not in a and "error" not in b]
    entry["verdict"] = "holds" if ratio <= TARGET else "falls short"
    return entry


def table(results: dict[str, Any]) -> str:
    lines = [
        "| library | pool handed over as | evaluations (ms each) | stdlib, s (efficiency) "
        "| fiberexec, s (efficiency) | fiberexec/stdlib | all ratios | target | verdict "
        "| stdlib forkserver, s | fiberexec/forkserver |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for library, entry in results.items():
        if "skipped" in entry:
            lines.append(f"| {library} | {HOW[library]} | skipped: {entry['skipped']} "
                         "| - | - | - | - | - | not measured | - | - |")
            continue
        if "error" in entry:
            lines.append(f"| {library} | {HOW[library]} | error: {entry['error'][:80]} "
                         f"| - | - | - | - | <= {TARGET} | not measured | - | - |")
            continue
        std, ours, server = entry["stdlib"], entry["fiberexec"], entry["forkserver"]
        lines.append(
            f"| {library} | {HOW[library]} | {ours['evaluations']:.0f} ({ours['eval_ms']:.2f}) "
            f"| {std['seconds']:.2f} ({std['efficiency']:.2f}) "
            f"| {ours['seconds']:.2f} ({ours['efficiency']:.2f}) | {entry['ratio']:.2f}x "
            f"| {', '.join(f'{r:.2f}' for r in entry['ratios'])} | <= {TARGET}x "
            f"| {entry['verdict']} | {server['seconds']:.2f} ({server['efficiency']:.2f}) "
            f"| {entry['ratio_forkserver']:.2f}x |")
    return "\n".join(lines)


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _brief(metrics: Metrics) -> str:
    if "error" in metrics:
        return f"ERROR {metrics['error'][:100]}"
    return (f"seconds={metrics['seconds']:.3f} evaluations={metrics['evaluations']} "
            f"efficiency={metrics['efficiency']:.2f} found={metrics['found']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller runs, 1 repeat")
    parser.add_argument("--repeat", type=int, default=0, help="runs per system (3; quick 1)")
    parser.add_argument("--libraries", default="",
                        help=f"comma-separated subset of {','.join(LIBRARIES)}")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="seconds one run may take (300; quick 120)")
    parser.add_argument("--output", type=Path, default=HERE / "libraries.json")
    parser.add_argument("--one", nargs=3, metavar=("LIBRARY", "SYSTEM", "SIZE"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        from benchmarks.measure import report

        return report(lambda: measure_one(*options.one))
    results, meta = run(options)
    print(table(results))
    print(f"\n{meta['mode']} run, median of {meta['repeat']}, {meta['seconds']}s, "
          f"load average {meta['load_average_before'][0]:.2f} before, "
          f"{meta['load_average_after'][0]:.2f} after")
    options.output.write_text(json.dumps({"meta": meta, "results": results}, indent=2,
                                         sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
