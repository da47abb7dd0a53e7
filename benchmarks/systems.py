"""One small adapter per system, so every workload is written once.

``submit`` returns a handle; ``result`` waits for one with a timeout; ``map`` consumes a whole
chunked map; ``close`` is the timed shutdown. ``mp.Pool`` is adapted through ``apply_async``
and ``map_async``, whose results carry their own timeouts.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

SYSTEMS = ("stdlib", "mp.Pool", "fiberexec")


class FuturesSystem:
    """Any `concurrent.futures.Executor`: the standard library's and fiberexec's."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = self.executor.submit(fn, *args)
        return future

    def result(self, handle: Future[Any], timeout: float) -> Any:
        return handle.result(timeout=timeout)

    def wait_all(self, handles: list[Future[Any]], timeout: float) -> None:
        _, pending = wait_futures(handles, timeout=timeout)
        if pending:
            raise TimeoutError(f"{len(pending)} of {len(handles)} tasks unfinished "
                               f"after {timeout}s")
        for handle in handles:
            handle.result(timeout=0)  # re-raise a task's exception, if any

    def map(self, fn: Callable[..., Any], items: Iterable[Any], chunksize: int,
            timeout: float) -> int:
        # the list a user takes, as `PoolSystem.map` gets one (no Python-level loop per item)
        return len(list(self.executor.map(fn, items, chunksize=chunksize, timeout=timeout)))

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class PoolSystem:
    """`multiprocessing.Pool`, adapted to the same five operations."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.pool.apply_async(fn, args)

    def result(self, handle: Any, timeout: float) -> Any:
        return handle.get(timeout)

    def wait_all(self, handles: list[Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for handle in handles:
            handle.get(max(0.0, deadline - time.monotonic()))

    def map(self, fn: Callable[..., Any], items: Iterable[Any], chunksize: int,
            timeout: float) -> int:
        return len(self.pool.map_async(fn, items, chunksize=chunksize).get(timeout))

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


def start_method(system: str) -> str:
    """How the system starts its workers (the stdlib's default on this platform)."""
    if system == "fiberexec":
        return "spawned (python -m fiberexec.worker)"
    return multiprocessing.get_start_method(allow_none=False)


def preload(system: str) -> None:
    """Import what `make` needs, so that a timed `make` does not count imports."""
    if system == "fiberexec":  # the package is lazy: load the executor and local backend
        import importlib

        importlib.import_module("fiberexec._executor")
        importlib.import_module("fiberexec.backends.local")


def make(system: str, workers: int) -> FuturesSystem | PoolSystem:
    """Construct ``system`` with ``workers`` workers (the timed part of construct-to-first)."""
    if system == "stdlib":
        return FuturesSystem(ProcessPoolExecutor(max_workers=workers))
    if system == "mp.Pool":
        return PoolSystem(multiprocessing.Pool(processes=workers))
    if system == "fiberexec":
        from fiberexec import FiberExecutor

        return FuturesSystem(FiberExecutor(max_workers=workers))
    raise ValueError(f"system must be one of {', '.join(SYSTEMS)}, got {system!r}")
