"""SciPy: `differential_evolution` with ``workers=pool.map``.

The user's program: ``import multiprocessing as mp`` (or ``import fiberexec.multiprocessing
as mp``), then ``with mp.Pool(2) as pool: differential_evolution(f, bounds,
workers=pool.map, updating="deferred")``. SciPy maps the whole population of each
generation (``popsize * dim`` = 60 members) at once.
"""

from __future__ import annotations

import time
from types import ModuleType

from scipy.optimize import differential_evolution

from benchmarks.programs import WORKERS, Outcome, model

KIND = "pool"
GENERATIONS = {"full": 80, "quick": 25}


def run(mp: ModuleType, size: str) -> Outcome:
    bounds = [(model.LOWER, model.UPPER)] * model.DIM
    start = time.perf_counter()
    with mp.Pool(WORKERS) as pool:
        # tol=0 and no polish: every run does the same number of generations, all on the pool
        result = differential_evolution(model.misfit, bounds, workers=pool.map,
                                        updating="deferred", maxiter=GENERATIONS[size],
                                        popsize=15, tol=0, polish=False, rng=0)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "evaluations": int(result.nfev),
            "found": [round(float(v), 3) for v in result.x], "best": float(result.fun)}
