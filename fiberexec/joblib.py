"""joblib backend ``"fiber"``: run `joblib.Parallel` (and scikit-learn's ``n_jobs``) on fiberexec.

Importing this module registers the backend::

    import fiberexec.joblib  # noqa: F401
    from joblib import Parallel, delayed, parallel_config

    with parallel_config(backend="fiber", n_jobs=16, executor_backend="kubernetes",
                         image="me/app:1", max_task_retries=3):
        results = Parallel()(delayed(fit)(p) for p in grid)

Options other than joblib's own are `FiberExecutor` arguments; the executor's backend is
``executor_backend=`` because joblib already uses ``backend=``. Workers need joblib installed.
Executors stay warm between calls with the same options; `shutdown_executors()` stops them,
and `workers()` shows their workers and the batches they run.
"""

from __future__ import annotations

try:
    import joblib  # noqa: F401  # (an extra: say which, where it is missing)
except ModuleNotFoundError as exc:
    if exc.name != "joblib":
        raise
    raise ModuleNotFoundError(
        "fiberexec.joblib needs joblib, which is not installed; install it with "
        "pip install 'fiberexec[joblib]' (or pip install joblib)", name="joblib") from exc

from fiberexec._joblib_backend import FiberBackend, in_worker, shutdown_executors, workers

BACKEND_NAME = "fiber"


def register(name: str = BACKEND_NAME, *, make_default: bool = False) -> None:
    """Register `FiberBackend` with joblib under ``name`` (done once on import as ``"fiber"``).

    Args:
        name: the name ``Parallel(backend=...)`` and ``parallel_config`` select it by.
        make_default: make it joblib's default backend for this process.
    """
    from joblib import register_parallel_backend

    register_parallel_backend(name, FiberBackend, make_default=make_default)


register()

__all__ = ["BACKEND_NAME", "FiberBackend", "in_worker", "register", "shutdown_executors",
           "workers"]
