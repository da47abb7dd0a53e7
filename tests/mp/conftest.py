"""Run the multiprocessing layer on the backend under test; fail tests that leak children."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

import fiberexec.multiprocessing as mp
from tests.conftest import BACKEND
from tests.support.backend_local import descendants_running
from tests.support.kit import BackendKit

# What a child inherits from this process is for children on this host
collect_ignore = [] if BACKEND == "local" else ["test_compat_inherit.py"]


def _process_children() -> list[psutil.Process]:
    return descendants_running("_process_main")


@pytest.fixture(autouse=True)
def mp_backend(kit: BackendKit) -> Iterator[BackendKit]:
    """Processes, pools, managers and the broker use the backend under test."""
    mp.set_default_backend(kit.make_backend)
    yield kit
    for child in mp.active_children():
        child.kill()
        child.join(10)
    mp.set_default_backend(kit.make_backend)  # closes the processes' backend
    procs = _process_children()
    if procs:
        _, procs = psutil.wait_procs(procs, timeout=5)
    for proc in procs:
        proc.kill()
    assert not procs, f"test left these Process children running: {procs}"
