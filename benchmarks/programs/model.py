"""The objective every program optimizes or samples: fit a small recurrent model to data.

``misfit(params)`` runs a 48-unit tanh recurrence for 150 steps, driven by the parameters
through a fixed input matrix, and returns the squared distance of its readout to the
readout that `TRUE_PARAMS` produce. One call is about 1 ms of numpy on one core (the
benchmark measures it in each run), small enough that a pool's per-task cost matters.
Only numpy is imported, so a worker that unpickles an objective does not import more.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

DIM = 4
HIDDEN = 48
STEPS = 150
LOWER, UPPER = -2.0, 2.0  # the box every program searches
TRUE_PARAMS = np.array([0.5, -0.3, 0.8, 0.1])

_rng = np.random.default_rng(7)
_W = _rng.standard_normal((HIDDEN, HIDDEN)) * (0.9 / np.sqrt(HIDDEN))
_U = _rng.standard_normal((HIDDEN, DIM))
_READOUT = _rng.standard_normal(HIDDEN) / np.sqrt(HIDDEN)


def trajectory(params: Any) -> np.ndarray[Any, Any]:
    """The model's readout over `STEPS` steps for ``params`` (a sequence of `DIM` floats)."""
    drive = _U @ np.asarray(params, dtype=float)
    h = np.zeros(HIDDEN)
    out = np.empty(STEPS)
    for t in range(STEPS):
        h = np.tanh(_W @ h + drive)
        out[t] = _READOUT @ h
    return out


_OBSERVED = trajectory(TRUE_PARAMS)


def misfit(params: Any) -> float:
    """Squared distance of the model's readout for ``params`` to the observed one (>= 0)."""
    return float(np.sum(np.square(trajectory(params) - _OBSERVED)))


def time_misfit(samples: int = 30) -> float:
    """The median wall time of one `misfit` call in this process, in seconds."""
    x = TRUE_PARAMS + 0.1
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        misfit(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
