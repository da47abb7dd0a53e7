"""Task functions every system runs. They live in an importable module so that the standard
library's pickler sends them by reference to all three kinds of worker."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import numpy as np

ARRAY_BYTES = 10 * 1024 * 1024
ES_DIM = 1000
ES_ROWS = 64

OBJECT_ROWS = 1_000_000  # strings in `object_rows`: an 18 MiB pickle stream of Python objects

_cached_array: np.ndarray[Any, Any] | None = None
_cached_rows: list[str] | None = None
_es_matrix: np.ndarray[Any, Any] | None = None


def noop(*_args: object) -> None:
    """Does nothing; what a no-op task costs is the executor's own overhead."""


def print_mib(mib: int, discard: bool = False) -> int:
    """Print ``mib`` MiB to stdout in 100-byte lines; with ``discard``, the same prints to
    /dev/null (the same work in the worker, nothing for the executor to forward)."""
    line = "x" * 99
    with open(os.devnull, "w") if discard else contextlib.nullcontext(sys.stdout) as out:
        for _ in range(mib * (1 << 20) // 100):
            print(line, file=out)
    return mib


def sleep_1ms() -> None:
    time.sleep(0.001)


def spin(seconds: float) -> float:
    """Keeps its core busy for ``seconds`` (a small objective's evaluation, holding the GIL
    as a numpy model's Python loop does), and returns it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return seconds


def array_nbytes(arr: np.ndarray[Any, Any]) -> int:
    return int(arr.nbytes)


def cached_array() -> np.ndarray[Any, Any]:
    """A 10 MiB array created once per worker, so only its transfer is measured."""
    global _cached_array
    if _cached_array is None:
        _cached_array = np.ones(ARRAY_BYTES, dtype=np.uint8)
    return _cached_array


def object_rows() -> list[str]:
    """Many small Python objects: what a rollout's records or a parsed file look like."""
    return [f"row {i:012d}" for i in range(OBJECT_ROWS)]


def count_rows(rows: list[str]) -> int:
    return len(rows)


def cached_rows() -> list[str]:
    """`object_rows`, made once per worker, so only its transfer is measured."""
    global _cached_rows
    if _cached_rows is None:
        _cached_rows = object_rows()
    return _cached_rows


def _matrix() -> np.ndarray[Any, Any]:
    global _es_matrix
    if _es_matrix is None:
        rng = np.random.default_rng(1234)
        _es_matrix = rng.standard_normal((ES_ROWS, ES_DIM)) / np.sqrt(ES_DIM)
    return _es_matrix


def es_fitness(params: np.ndarray[Any, Any], iters: int) -> float:
    """A toy fitness: ``iters`` rounds of two matrix-vector products through a fixed layer."""
    w = _matrix()
    x = params
    for _ in range(iters):
        x = np.tanh(w.T @ np.tanh(w @ x))
    return float(-np.square(x - 0.5).sum())


def calibrate_es(target: float = 0.002, samples: int = 30) -> tuple[int, float]:
    """Pick ``iters`` so one `es_fitness` call takes about ``target`` seconds on one core.

    Returns ``(iters, seconds)``: the count and the median time of one call with it.
    """
    params = np.zeros(ES_DIM)
    iters = 1
    for _ in range(20):  # bounded doubling
        if time_es(params, iters, 5) >= target / 4:
            break
        iters *= 2
    per_iter = time_es(params, iters, samples) / iters
    iters = max(1, round(target / per_iter))
    return iters, time_es(params, iters, samples)


def time_es(params: np.ndarray[Any, Any], iters: int, samples: int) -> float:
    """The median wall time of one `es_fitness(params, iters)` call, in this process."""
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        es_fitness(params, iters)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def es_sampled_fitness(params: np.ndarray[Any, Any], seed: int) -> float:
    """A fitness that reads a seeded sample of a large parameter vector: moving the vector,
    not computing on it, is the cost (an ES whose workers hold a big model)."""
    rng = np.random.default_rng(seed)
    picked = params[rng.integers(0, params.size, 1000)]
    return float(-np.square(picked - 0.5).sum())


MATMUL_SIZE = 300


def matmul(seed: int) -> float:
    """Five products of a 300 x 300 matrix with itself: BLAS level-3 work, which OpenBLAS
    and MKL spread over as many threads as the process was told it may start."""
    a = np.random.default_rng(seed).standard_normal((MATMUL_SIZE, MATMUL_SIZE))
    for _ in range(5):
        a = np.tanh(a @ a / MATMUL_SIZE)
    return float(a.sum())
