"""What a worker tells about itself: its resource use, and the stacks of its threads.

Both run in the worker, off the thread running tasks, and cost microseconds: the usage goes
out with every heartbeat, the stacks when the executor asks (`FiberExecutor.dump_stack`).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import traceback

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Usage:
    """CPU use between two readings (100 is one core busy) and the current resident memory."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.monotonic()

    def read(self) -> tuple[float, int]:
        cpu, wall = time.process_time(), time.monotonic()
        elapsed = wall - self._wall
        percent = 100.0 * (cpu - self._cpu) / elapsed if elapsed > 0 else 0.0
        self._cpu, self._wall = cpu, wall
        return max(percent, 0.0), rss_bytes()


def rss_bytes() -> int:
    """Resident memory now (``/proc``); where there is none, the peak (`resource`)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB here


def format_stacks(first: int | None = None, *, doing: str | None = "running the task") -> str:
    """The stack of every thread, thread ``first`` (an ident) first. The calling thread,
    unless it is ``first``, is named without its frames (they would show only how it came
    to answer). A ``first`` thread ``doing`` nothing is said to be idle, without the
    worker's own frames."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    frames = sorted(sys._current_frames().items(), key=lambda pair: pair[0] != first)
    parts = []
    for ident, frame in frames:
        title = f'Thread "{names.get(ident, "?")}" ({ident})'
        if ident == me and ident != first:
            parts.append(f"{title}, writing this report\n")
            continue
        if ident == first and doing is None:
            parts.append(f"{title}, idle, waiting for a task\n")
            continue
        if ident == first:
            title += f", {doing}"
        parts.append(f"{title}, most recent call last:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)
