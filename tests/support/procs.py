"""Ending a helper process the tests started: wait for it, kill it if it will not end."""

from __future__ import annotations

import subprocess
from typing import Any


def reap(proc: subprocess.Popen[Any], timeout: float) -> int:
    """Wait up to ``timeout`` seconds for ``proc`` to end, then kill it; its exit code."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=10)
