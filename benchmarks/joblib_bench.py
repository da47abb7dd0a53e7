"""joblib ``Parallel`` on ``"fiber"`` against joblib's default ``"loky"``, in the same run.

Every (system, workload) pair runs in a fresh Python process: one untimed warm-up call starts
the workers, then the median of ``--repeat`` timed calls is reported, with the first call
(worker start included) alongside. Prints a markdown table; ratio > 1 means fiber is faster.

    python benchmarks/joblib_bench.py            # full sizes
    python benchmarks/joblib_bench.py --quick    # a smoke run in well under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SYSTEMS = ("loky", "fiber")
CHILD_TIMEOUT = 600.0
MIB = 1 << 20


def noop(x: int) -> int:
    return x


def sleep_1ms(x: int) -> int:
    time.sleep(0.001)
    return x


def total(array: Any) -> float:
    return float(array.sum())


def invert(seed: int) -> float:
    """Linear algebra a BLAS runs on as many threads as it is told: 20 inverses, 300 x 300."""
    import numpy as np

    a = np.random.default_rng(seed).random((300, 300))
    return sum(float(np.linalg.inv(a @ a.T + np.eye(300)).sum()) for _ in range(20))


def make(mib: int) -> Any:
    import numpy as np

    return np.ones(mib * MIB // 8)


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str  # what the rate counts
    build: Callable[[bool], tuple[list[Any], float]]  # quick -> (delayed calls, units)


def _small(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n = 20_000 if quick else 200_000
    return [delayed(noop)(i) for i in range(n)], n


def _ms(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n = 200 if quick else 1000
    return [delayed(sleep_1ms)(i) for i in range(n)], n


def _blas(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n = 8 if quick else 16
    return [delayed(invert)(i) for i in range(n)], n


def _large_in(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n, mib = (4, 20) if quick else (8, 40)
    arrays = [make(mib) for _ in range(n)]
    return [delayed(total)(a) for a in arrays], n * mib


def _large_shared(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n, mib = (8, 20) if quick else (16, 40)
    array = make(mib)  # the same array to every task, as GridSearchCV sends X
    return [delayed(total)(array) for _ in range(n)], n * mib


def _large_out(quick: bool) -> tuple[list[Any], float]:
    from joblib import delayed

    n, mib = (4, 20) if quick else (8, 40)
    return [delayed(make)(mib) for _ in range(n)], n * mib


WORKLOADS = {
    w.name: w
    for w in (
        Workload("many small tasks (no-op)", "tasks/s", _small),
        Workload("1 ms tasks", "tasks/s", _ms),
        Workload("BLAS tasks (matrix inverses)", "tasks/s", _blas),
        Workload("few large arrays to tasks", "MiB/s", _large_in),
        Workload("one large array to many tasks", "MiB/s", _large_shared),
        Workload("few large arrays from tasks", "MiB/s", _large_out),
    )
}


# ---------------------------------------------------------------- child: one system, one workload


def run_child(system: str, workload: str, quick: bool, repeat: int, n_jobs: int) -> dict[str, Any]:
    from joblib import Parallel, delayed

    if system == "fiber":
        import fiberexec.joblib as fj
    calls, units = WORKLOADS[workload].build(quick)
    start = time.perf_counter()
    Parallel(n_jobs=n_jobs, backend=system)(delayed(noop)(i) for i in range(n_jobs * 4))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):  # a new Parallel per call, as scikit-learn does for each fit
        start = time.perf_counter()
        Parallel(n_jobs=n_jobs, backend=system)(calls)
        times.append(time.perf_counter() - start)
    if system == "fiber":
        fj.shutdown_executors()
    median = statistics.median(times)
    return {"rate": units / median, "seconds": median, "first_call": first}


# ---------------------------------------------------------------- parent: fresh process per pair


def measure(system: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", system, workload, "--repeat", str(args.repeat),
           "--n-jobs", str(args.n_jobs)] + (["--quick"] if args.quick else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(),
                                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=env,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{system} / {workload} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(results: dict[tuple[str, str], dict[str, Any]]) -> str:
    rows = ["| workload | loky | fiber | fiber / loky | first call loky / fiber, s |",
            "|---|---|---|---|---|"]
    for name, w in WORKLOADS.items():
        loky, fiber = results[("loky", name)], results[("fiber", name)]
        rows.append(
            f"| {name} | {loky['rate']:,.0f} {w.unit} | {fiber['rate']:,.0f} {w.unit} | "
            f"{fiber['rate'] / loky['rate']:.2f}x | "
            f"{loky['first_call']:.2f} / {fiber['first_call']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    if args.child:
        print(json.dumps(run_child(*args.child, args.quick, args.repeat, args.n_jobs)))
        return
    results = {}
    for name in WORKLOADS:
        for system in SYSTEMS:
            results[(system, name)] = measure(system, name, args)
            print(f"  {system:5} {name}: {results[(system, name)]['seconds']:.3f} s",
                  file=sys.stderr)
    print(f"n_jobs={args.n_jobs}, median of {args.repeat}, each in a fresh process\n")
    print(table(results))


if __name__ == "__main__":
    main()
