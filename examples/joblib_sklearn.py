"""scikit-learn on fiberexec, unchanged: ``n_jobs`` under ``parallel_config(backend="fiber")``.

Runs a grid search and a cross-validation sequentially and on the "fiber" backend, checks the
results agree, and prints the timings. Pass ``--backend docker --image fiberexec-test:latest``
(or ``kubernetes``) to run the same fits in containers or pods; the workers need scikit-learn.

    python examples/joblib_sklearn.py --n-jobs 2
    python examples/joblib_sklearn.py --small     # a smaller grid and fewer folds (the tests)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from joblib import parallel_config
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.svm import SVC

import fiberexec.joblib as fiber_joblib


def timed(label: str, fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - start
    print(f"  {label:<34} {elapsed:7.2f} s")
    return value, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--backend", default=None, help="local (default), docker, kubernetes")
    parser.add_argument("--image", default=None, help="worker image for docker / kubernetes")
    parser.add_argument("--small", action="store_true",
                        help="a quick run: 500 samples, a grid of 2 x 2, 3 folds")
    args = parser.parse_args()
    options = {k: v for k, v in (("executor_backend", args.backend), ("image", args.image)) if v}

    X, y = load_digits(return_X_y=True)
    grid = {"C": [1, 10, 100], "gamma": [0.0005, 0.001, 0.005]}
    folds, cv_folds = 5, 10
    if args.small:
        X, y = X[:500], y[:500]
        grid, folds, cv_folds = {"C": [1, 10], "gamma": [0.001, 0.005]}, 3, 3
    size = len(grid["C"]) * len(grid["gamma"])

    def search(n_jobs: int | None) -> Callable[[], GridSearchCV]:
        return lambda: GridSearchCV(SVC(), grid, cv=folds, n_jobs=n_jobs).fit(X, y)

    def cv(n_jobs: int | None) -> Callable[[], Any]:
        return lambda: cross_val_score(SVC(gamma=0.001), X, y, cv=cv_folds, n_jobs=n_jobs)

    print(f"digits: {X.shape[0]} samples; grid of {size} x {folds} folds; n_jobs={args.n_jobs}")
    seq_search, t_seq = timed("GridSearchCV, sequential", search(None))
    seq_cv, _ = timed("cross_val_score, sequential", cv(None))
    with parallel_config(backend="fiber", **options):
        _, t_first = timed("GridSearchCV, fiber (cold start)", search(args.n_jobs))
        par_search, t_par = timed("GridSearchCV, fiber (warm)", search(args.n_jobs))
        par_cv, _ = timed("cross_val_score, fiber (warm)", cv(args.n_jobs))
    fiber_joblib.shutdown_executors()
    with parallel_config(backend="loky"):  # joblib's default, for reference
        timed("GridSearchCV, loky (cold start)", search(args.n_jobs))
        timed("GridSearchCV, loky (warm)", search(args.n_jobs))

    assert par_search.best_params_ == seq_search.best_params_
    assert list(par_search.cv_results_["mean_test_score"]) == list(
        seq_search.cv_results_["mean_test_score"]
    )
    assert list(par_cv) == list(seq_cv)
    print(f"same results; best {par_search.best_params_} "
          f"score {par_search.best_score_:.4f}; speed-up {t_seq / t_par:.2f}x (warm), "
          f"{t_seq / t_first:.2f}x (cold)")


if __name__ == "__main__":
    main()
