"""Task functions the joblib tests send to workers (importable, so every backend can load them)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_marker: str | None = None


def set_marker(value: str) -> None:
    """A worker initializer: proves executor options reached the workers."""
    global _marker
    _marker = value


def read_marker(_: object = None) -> str | None:
    return _marker


def pid(_: object = None) -> int:
    return os.getpid()


def square(x: int) -> int:
    return x * x


def sleep_return(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def fail_on(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"task {x} refuses")
    return x


def nested_sum(n: int) -> tuple[int, str]:
    """Run a nested `Parallel` inside a task; report the backend it got."""
    from joblib import Parallel, delayed
    from joblib.parallel import get_active_backend

    total = sum(Parallel(n_jobs=2)(delayed(square)(i) for i in range(n)))
    return total, type(get_active_backend()[0]).__name__


def nested_explicit_fiber(n: int) -> tuple[int, int]:
    """Ask for ``"fiber"`` inside a worker; it falls back to threads in this process."""
    from joblib import Parallel, delayed

    import fiberexec.joblib  # noqa: F401

    pids = Parallel(n_jobs=2, backend="fiber")(delayed(pid)(i) for i in range(n))
    return len(set(pids)), threading.active_count()


def array_stats(array: Any) -> tuple[int, float]:
    return int(array.nbytes), float(array.sum())


def make_array(n: int, value: float) -> Any:
    import numpy as np

    return np.full(n, value)


def array_view(array: Any) -> tuple[str, str | None, bool, float]:
    """How a task got ``array``: its type, the file it maps (if any), writable, its sum."""
    filename = getattr(array, "filename", None)
    return type(array).__name__, filename, bool(array.flags.writeable), float(array.sum())


def write_at(out: Any, i: int) -> None:
    """Fill one slot of ``out`` (joblib's way to collect results in shared memory)."""
    out[i] = i + 100


def thread_limits(_: object = None) -> dict[str, str | None]:
    """What a worker's numerical libraries are told in its environment."""
    import os

    return {var: os.environ.get(var) for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                  "MKL_NUM_THREADS")}


def exit_now(code: int) -> None:
    """End the worker process at once, as a crash in native code would."""
    os._exit(code)


def first_item(array: Any) -> int:
    """The array's first item, as an int."""
    return round(float(array.flat[0]))
