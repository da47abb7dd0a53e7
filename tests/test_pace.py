"""Replacements of lost workers are paced: a burst at once, then at the refill rate."""

from __future__ import annotations

import pytest

from fiberexec._pace import REFILL, Pace
from tests.support.clock import FakeClock


def test_a_burst_starts_at_once_then_each_start_waits_its_turn() -> None:
    clock = FakeClock(100.0)
    pace = Pace(4, clock)
    assert [pace.wait() for _ in range(4)] == [0.0] * 4
    step = REFILL / 4
    assert [pace.wait() for _ in range(3)] == pytest.approx([step, 2 * step, 3 * step])
    assert pace.deferred == 3


def test_the_bucket_refills_with_time_and_never_beyond_its_size() -> None:
    clock = FakeClock(100.0)
    pace = Pace(2, clock)
    assert pace.wait() == 0.0 and pace.wait() == 0.0
    clock.now += REFILL / 2  # one token back
    assert pace.wait() == 0.0
    assert pace.wait() > 0.0
    clock.now += 100 * REFILL  # long quiet: full again, not more
    assert [pace.wait() for _ in range(2)] == [0.0, 0.0]
    assert pace.wait() > 0.0


def test_a_pool_may_replace_every_worker_at_once() -> None:
    assert Pace.for_pool(2).burst == 8
    assert Pace.for_pool(512).burst == 512
    with pytest.raises(ValueError, match="burst must be >= 1, got 0"):
        Pace(0)
