"""emcee: sample the model's posterior with an `EnsembleSampler` on a `multiprocessing.Pool`.

The user's program: ``import multiprocessing as mp`` (or ``import fiberexec.multiprocessing
as mp``), then ``with mp.Pool(2) as pool: emcee.EnsembleSampler(..., pool=pool)``. emcee
calls ``pool.map`` twice per step, on half of the walkers each time.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import emcee
import numpy as np

from benchmarks.programs import WORKERS, Outcome, model

KIND = "pool"
WALKERS = 32
STEPS = {"full": 150, "quick": 50}
NOISE = 0.05  # the readout's measurement noise, for the likelihood


def log_prob(params: np.ndarray[Any, Any]) -> float:
    """A flat prior on the search box and a Gaussian likelihood of the observed readout."""
    if np.any(params < model.LOWER) or np.any(params > model.UPPER):
        return -np.inf
    return -0.5 * model.misfit(params) / NOISE**2


def run(mp: ModuleType, size: str) -> Outcome:
    steps = STEPS[size]
    rng = np.random.default_rng(0)
    start_points = model.TRUE_PARAMS + 0.05 * rng.standard_normal((WALKERS, model.DIM))
    start = time.perf_counter()
    with mp.Pool(WORKERS) as pool:
        sampler = emcee.EnsembleSampler(WALKERS, model.DIM, log_prob, pool=pool)
        sampler.random_state = np.random.RandomState(0).get_state()  # the same moves each run
        sampler.run_mcmc(start_points, steps)
        chain = sampler.get_chain(discard=steps // 2, flat=True)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "evaluations": WALKERS * (steps + 1),
            "found": [round(float(v), 3) for v in chain.mean(axis=0)],
            "acceptance": round(float(np.mean(sampler.acceptance_fraction)), 3)}
