"""`make`: a test of shared behaviour runs over `ProcessPoolExecutor` (spawn) and ours."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import pytest

from tests import tasks
from tests.conftest import BACKEND, ExecutorFactory

SPAWN = multiprocessing.get_context("spawn")
Make = Callable[..., Executor]


def under_test(*names: str) -> list[str]:
    """Which of ``names`` run in this env: the stdlib's runs (each name not starting with
    ``fiberexec``) are the reference and use no backend, so they run once, in the local env."""
    return [name for name in names if BACKEND == "local" or name.startswith("fiberexec")]


@pytest.fixture(params=under_test("stdlib", "fiberexec"))
def make(request: pytest.FixtureRequest,
         make_executor: ExecutorFactory) -> Iterator[Make]:
    if request.param == "fiberexec":
        yield make_executor
        return
    made: list[Executor] = []

    def stdlib(max_workers: int, **kwargs: Any) -> Executor:
        made.append(ProcessPoolExecutor(max_workers, mp_context=SPAWN, **kwargs))
        return made[-1]

    yield stdlib
    for ex in made:
        ex.shutdown(cancel_futures=True)


def sees_us(make_executor: ExecutorFactory) -> bool:
    """Whether the backend's workers see this process (its pid namespace) and its
    /dev/shm, where the stdlib's queues and locks are reached: else only
    ``fiberexec.multiprocessing`` objects reach them."""
    with make_executor(1) as probe:
        there = probe.submit(tasks.host_view).result(timeout=60)
    return bool(there == tasks.host_view())
