"""What the Fiber API tests run in other processes (importable, so every backend can load it)."""

from __future__ import annotations

import time
from typing import Any


class Env:
    """A tiny environment in the shape the launch article steps: (obs, reward, done, info)."""

    def __init__(self, seed: int = 0) -> None:
        self.state = seed

    def reset(self) -> int:
        self.state = 0
        return self.state

    def step(self, action: int) -> tuple[int, float, bool, dict[str, Any]]:
        if action < 0:
            raise ValueError(f"action {action} is not in the action space")
        self.state += action
        return self.state, float(action), self.state >= 10, {}

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return "slow"


def put_one(queue: Any, value: Any) -> None:
    queue.put(value)
