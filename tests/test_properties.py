"""Properties over random inputs, on a real executor with real workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fiberexec import FiberExecutor
from tests import tasks
from tests.support.kit import BackendKit

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def executors(kit: BackendKit) -> Iterator[dict[int, FiberExecutor]]:
    made = {
        n: FiberExecutor(n, backend=kit.make_backend(), heartbeat=0.5, **kit.executor_kwargs)
        for n in (1, 3)
    }
    yield made
    for ex in made.values():
        ex.shutdown()


@SETTINGS
@given(
    st.lists(st.integers(-1000, 1000), max_size=60),
    st.integers(1, 25),
    st.sampled_from([1, 3]),
)
def test_map_equals_builtin_map(
    executors: dict[int, FiberExecutor], items: list[int], chunksize: int, workers: int
) -> None:
    ex = executors[workers]
    assert list(ex.map(tasks.square, items, chunksize=chunksize, timeout=60)) == list(
        map(tasks.square, items)
    )


class PoolMachine(RuleBasedStateMachine):
    """Submits, completions and worker losses never lose or duplicate a result."""

    def __init__(self) -> None:
        super().__init__()
        self.ex = FiberExecutor(2, heartbeat=0.5, max_task_retries=5, backend=_kit().make_backend())
        self.expected: dict[int, object] = {}
        self.futures: dict[int, object] = {}
        self.next = 0
        self.kills = 0
        self.marker_dir = Path(os.environ.get("TMPDIR", "/tmp"))

    @rule(values=st.lists(st.integers(), min_size=1, max_size=20))
    def submit_batch(self, values: list[int]) -> None:
        for value in values:
            self.futures[self.next] = self.ex.submit(tasks.square, value)
            self.expected[self.next] = value * value
            self.next += 1

    @rule(seconds=st.sampled_from([0.0, 0.01, 0.05]))
    def submit_slow(self, seconds: float) -> None:
        self.futures[self.next] = self.ex.submit(tasks.sleep_return, seconds, self.next)
        self.expected[self.next] = self.next
        self.next += 1

    @precondition(lambda self: self.kills < 3)
    @rule()
    def kill_a_worker_mid_task(self) -> None:
        marker = self.marker_dir / f"fiberexec-sm-{os.getpid()}-{id(self)}-{self.kills}"
        self.futures[self.next] = self.ex.submit(tasks.kill_self_once, str(marker), self.next)
        self.expected[self.next] = self.next
        self.next += 1
        self.kills += 1

    @rule()
    def collect_some(self) -> None:
        for key in list(self.futures)[:10]:
            assert self.futures.pop(key).result(timeout=60) == self.expected.pop(key)  # type: ignore[attr-defined]

    @invariant()
    def counts_add_up(self) -> None:
        stats = self.ex.stats()
        assert stats.tasks_done + stats.tasks_failed <= self.next

    def teardown(self) -> None:
        try:
            for key, future in self.futures.items():
                assert future.result(timeout=60) == self.expected[key]  # type: ignore[attr-defined]
            stats = self.ex.stats()
            assert stats.tasks_done == self.next and stats.tasks_failed == 0
        finally:
            self.ex.shutdown()
            for marker in self.marker_dir.glob(f"fiberexec-sm-{os.getpid()}-{id(self)}-*"):
                marker.unlink()


_SESSION_KIT: list[BackendKit] = []


def _kit() -> BackendKit:
    return _SESSION_KIT[0]


@pytest.fixture
def _bind_kit(kit: BackendKit) -> Iterator[None]:
    _SESSION_KIT.append(kit)
    yield
    _SESSION_KIT.clear()


@pytest.mark.slow
@pytest.mark.usefixtures("_bind_kit")
def test_pool_state_machine() -> None:
    PoolMachine.TestCase.settings = settings(
        max_examples=6, stateful_step_count=8, deadline=None
    )
    PoolMachine.TestCase().runTest()
