"""Tasks the Slurm chaos tests send to workers (importable by the workers)."""

from __future__ import annotations

import time


def hog_memory(mebibytes: int) -> int:
    """Touch ``mebibytes`` MiB and hold them long enough for Slurm's 1 s memory sampling."""
    block = b"x" * (mebibytes * 2**20)
    time.sleep(10)
    return len(block)
