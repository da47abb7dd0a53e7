"""Worker losses in the log: the first few one by one, then one summary line per window.

At a thousand workers a bad minute can lose hundreds; one warning each would bury the one
line that says why. `LossLog` keeps the first `FIRST` of each window as they are and counts
the rest, logging them as one line when the window closes (`flush`, from housekeeping).
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("fiberexec")
FIRST = 5  # losses per window logged one by one
WINDOW = 10.0  # seconds


class LossLog:
    def __init__(self) -> None:
        self._started = 0.0
        self._count = 0
        self._held: Counter[str] = Counter()  # kind of loss -> count, beyond the first ones
        self._latest = ""

    def lost(self, why: str, now: float) -> None:
        if now - self._started >= WINDOW:
            self.flush(now)
            self._started = now
        self._count += 1
        if self._count <= FIRST:
            log.warning("%s", why)
            return
        self._held[_kind(why)] += 1
        self._latest = why

    def flush(self, now: float) -> None:
        """Log what was held back, if the window is over (or ``now`` is ``inf``)."""
        if not self._held or now - self._started < WINDOW:
            return
        total = sum(self._held.values())
        kinds = ", ".join(_counted(n, kind) for kind, n in self._held.most_common())
        span = min(now, self._started + WINDOW) - self._started
        log.warning("%d more %s lost in %.0fs (%s); the latest: %s",
                    total, "worker" if total == 1 else "workers", span, kinds, self._latest)
        self._held.clear()
        self._count = 0


def _counted(n: int, kind: str) -> str:
    """``n`` workers that ended as ``kind`` says of one ("was killed by signal 9")."""
    if n > 1:
        for one, many in (("was ", "were "), ("has ", "have ")):
            if kind.startswith(one):
                kind = many + kind.removeprefix(one)
    return f"{n} {kind}"


def _kind(why: str) -> str:
    """A loss's kind, from the shard's words: what comes after the worker's name."""
    words = why.split(" ", 2)
    rest = words[2] if len(words) == 3 and words[0] == "worker" else why
    return rest.split(" while running ", 1)[0].split(" (", 1)[0].split(";", 1)[0]
