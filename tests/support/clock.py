"""A clock for unit tests: what ``time.monotonic`` is to the code under test, moved only by
the test (`advance`, or ``now`` set)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
