"""pymoo: NSGA-II on an elementwise problem with a ``StarmapParallelization`` runner.

The user's program: ``import multiprocessing as mp`` (or ``import fiberexec.multiprocessing
as mp``), then ``with mp.Pool(2) as pool:`` and the problem built with
``elementwise_runner=StarmapParallelization(pool.starmap)`` (pymoo >= 0.6.1; older releases
import it from ``pymoo.core.problem``). Two objectives: the model's misfit and the size of
the parameters; each generation's offspring (40) go to ``pool.starmap`` at once.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import ElementwiseProblem
from pymoo.optimize import minimize

from benchmarks.programs import WORKERS, Outcome, model

try:
    from pymoo.parallelization import StarmapParallelization
except ImportError:  # pymoo 0.6.1 kept it beside the problem classes
    from pymoo.core.problem import StarmapParallelization

KIND = "pool"
POPULATION = 40
GENERATIONS = {"full": 120, "quick": 40}


class ModelFit(ElementwiseProblem):
    """Minimize the misfit and the parameters' squared norm together."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(n_var=model.DIM, n_obj=2, xl=model.LOWER, xu=model.UPPER, **kwargs)

    def _evaluate(self, x: np.ndarray[Any, Any], out: dict[str, Any], *args: Any,
                  **kwargs: Any) -> None:
        out["F"] = [model.misfit(x), float(np.sum(np.square(x)))]


def run(mp: ModuleType, size: str) -> Outcome:
    start = time.perf_counter()
    with mp.Pool(WORKERS) as pool:
        problem = ModelFit(elementwise_runner=StarmapParallelization(pool.starmap))
        result = minimize(problem, NSGA2(pop_size=POPULATION), ("n_gen", GENERATIONS[size]),
                          seed=1, verbose=False)
        seconds = time.perf_counter() - start
    front = np.atleast_2d(result.F)
    return {"seconds": seconds, "evaluations": int(result.algorithm.evaluator.n_eval),
            "found": f"{len(front)} points on the front, "
                     f"best misfit {float(front[:, 0].min()):.3g}"}
