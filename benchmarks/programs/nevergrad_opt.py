"""Nevergrad: ``optimizer.minimize(f, executor=ex, batch_mode=False)`` on an executor.

The user's program: ``from concurrent.futures import ProcessPoolExecutor as Executor`` (or
``from fiberexec import FiberExecutor as Executor``), then ``with Executor(2) as ex:
optimizer.minimize(f, executor=ex, batch_mode=False)``. Out of batch mode Nevergrad keeps
``num_workers`` evaluations in flight and asks for a new point as soon as one finishes, so
each evaluation is one `submit` and a round trip.
"""

from __future__ import annotations

import time
from typing import Any

import nevergrad as ng
import numpy as np

from benchmarks.programs import WORKERS, Outcome, model

KIND = "executor"
BUDGET = {"full": 4000, "quick": 1200}


def run(executor: Any, size: str) -> Outcome:
    budget = BUDGET[size]
    space = ng.p.Array(shape=(model.DIM,), lower=model.LOWER, upper=model.UPPER)
    space.random_state = np.random.RandomState(0)
    optimizer = ng.optimizers.TwoPointsDE(parametrization=space, budget=budget,
                                          num_workers=WORKERS)
    start = time.perf_counter()
    with executor(WORKERS) as ex:
        best = optimizer.minimize(model.misfit, executor=ex, batch_mode=False)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "evaluations": int(optimizer.num_tell),
            "found": [round(float(v), 3) for v in best.value],
            "best": float(model.misfit(best.value))}
