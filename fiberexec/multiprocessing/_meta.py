"""Small module-level functions of the multiprocessing API."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """The number of CPUs in this machine (what `Pool` uses when not told)."""
    count = os.cpu_count()
    if count is None:
        raise NotImplementedError("cannot determine number of cpus")
    return count
