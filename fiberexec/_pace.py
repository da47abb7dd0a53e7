"""How fast lost workers are replaced: a token bucket, so a crash loop cannot turn into a
storm of starts that loads the machine and loses more workers.

A bucket holds ``burst`` starts and refills at ``burst`` per `REFILL` seconds. `Pace.wait`
takes a token if there is one (0.0: start now) or says how long until the next one; the
caller schedules the start for then. The clock is injected, so tests never sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable

REFILL = 10.0  # seconds to refill a whole bucket


class Pace:
    def __init__(self, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        self.burst = burst
        self.rate = burst / REFILL  # tokens per second
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self.deferred = 0  # starts that had to wait for a token

    @classmethod
    def for_pool(cls, max_workers: int, clock: Callable[[], float] = time.monotonic) -> Pace:
        """A pool of ``max_workers`` may replace all of them at once, and at least 8."""
        return cls(max(8, max_workers), clock)

    def wait(self) -> float:
        """Take a token: 0.0 if one was there, else the seconds until one will be (the
        token is then spoken for: each call reserves its own start)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= 1
        if self._tokens >= 0:
            return 0.0
        self.deferred += 1
        return -self._tokens / self.rate
