"""Tasks the fault tests send to workers on other hosts (importable there: shared tree)."""

from __future__ import annotations

import time


def slow_square(x: int, seconds: float = 0.002) -> int:
    time.sleep(seconds)
    return x * x
