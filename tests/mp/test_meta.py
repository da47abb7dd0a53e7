"""``fiberexec.meta``: resources a function needs reach the backend's worker spec."""

from __future__ import annotations

import logging

import pytest

import fiberexec
import fiberexec.multiprocessing as mp
from fiberexec import ConfigurationError
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from tests.mp import tasks


class _Recording(LocalBackend):
    """The real local backend, keeping every spec it was asked to start."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[WorkerSpec] = []

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        self.specs.append(spec)
        return super().start_worker(spec)


def test_meta_resources_reach_the_process_spec(caplog: pytest.LogCaptureFixture) -> None:
    backend = _Recording()
    try:
        with caplog.at_level(logging.INFO, logger="fiberexec"):
            p = mp.Process(target=tasks.heavy, args=(1,), backend=backend)
            p.start()
            p.join(timeout=60)
        assert p.exitcode == 0
        resources = backend.specs[0].resources
        assert (resources.cpu, resources.memory, resources.gpu) == (0.5, 256 * 2**20, 1)
        assert "does not enforce" in caplog.text  # local runs it anyway, and says so
    finally:
        backend.close()


def test_meta_resources_reach_the_pool_workers() -> None:
    backend = _Recording()
    try:
        with mp.Pool(1, backend=backend) as pool:
            assert pool.map(tasks.heavy, [1, 2, 3]) == [2, 3, 4]
        assert all(s.resources.cpu == 0.5 and s.resources.gpu == 1 for s in backend.specs)
    finally:
        backend.close()


def test_meta_validates_at_decoration() -> None:
    with pytest.raises(ConfigurationError, match="cpu must be > 0"):
        fiberexec.meta(cpu=0)
    with pytest.raises(ConfigurationError, match="memory must be bytes or a quantity"):
        fiberexec.meta(memory="much")
