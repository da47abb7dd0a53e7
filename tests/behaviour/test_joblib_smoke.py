"""joblib through the "fiber" backend on the backend under test (the full joblib suite runs
on the local backend: tests/test_joblib.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from joblib import Parallel, delayed, parallel_config

import fiberexec.joblib as fj
from tests import joblib_tasks as jt
from tests.support.kit import BackendKit

Options = dict[str, Any]


@pytest.fixture
def opts(kit: BackendKit) -> Iterator[Options]:
    """Executor options for the backend under test; warm executors are stopped afterwards."""
    yield {"executor_backend": kit.make_backend(), "heartbeat": 0.5, **kit.executor_kwargs}
    fj.shutdown_executors(wait=True)


def test_smoke_plain_pipeline(opts: Options) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        squares = Parallel()(delayed(jt.square)(i) for i in range(200))
        assert squares == [i * i for i in range(200)]
        assert sum(Parallel()(delayed(jt.square)(x) for x in squares[:10])) == sum(
            i**4 for i in range(10)
        )
