"""A `threading.Condition` whose notify costs nothing when no thread waits.

`threading.Condition.notify_all` is Python code that walks its waiter list even when the list
is empty; the channels and streams notify on every item, and nearly always nobody waits.
"""

from __future__ import annotations

import threading


class Condition(threading.Condition):
    def notify(self, n: int = 1) -> None:
        if self._waiters:  # type: ignore[attr-defined]
            super().notify(n)

    def notify_all(self) -> None:
        if self._waiters:  # type: ignore[attr-defined]
            super().notify(len(self._waiters))  # type: ignore[attr-defined]
