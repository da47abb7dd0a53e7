"""The task of `benchmarks.scale --task numpy`: `benchmarks.scale_tasks.sleep_pid` in a module
that imports numpy at its top, as a researcher's module of tasks usually does. A worker
imports numpy to load it: a forked stdlib worker has it from its parent, a spawned one
imports it itself (75 ms of CPU here), and fiberexec's launcher imports it once for the
workers it forks."""

from __future__ import annotations

import os
import time

import numpy as np


def sleep_pid(seconds: float) -> int:
    """Sleep, then say which worker ran the task (with numpy at hand)."""
    time.sleep(seconds)
    return os.getpid() + int(np.zeros(1)[0])
