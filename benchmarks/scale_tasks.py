"""The task of `benchmarks.scale`, in a module that imports only the standard library.

Hundreds of workers each import the module a task comes from, so it must be cheap to import
(`benchmarks.tasks` imports numpy).
"""

from __future__ import annotations

import os
import time


def sleep_pid(seconds: float) -> int:
    """Sleep, then say which worker ran the task."""
    time.sleep(seconds)
    return os.getpid()


def mark_and_sleep(path: str, seconds: float) -> None:
    """Leave a file at ``path`` (the call ran), then sleep."""
    with open(path, "w"):
        pass
    time.sleep(seconds)


def gil_sleep(seconds: float, value: int = 0) -> int:
    """Wait ``seconds`` in one C call that keeps the interpreter lock (`ctypes.PyDLL` does
    not release it), as a long regular expression or a C extension may: no other thread
    of the worker runs meanwhile."""
    import ctypes

    if seconds > 0:
        ctypes.PyDLL(None).usleep(int(seconds * 1e6))
    return value
