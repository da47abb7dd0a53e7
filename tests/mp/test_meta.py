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
    unreadable = "meta's memory must be MiB as a whole number .* or a quantity like '512Mi'"
    with pytest.raises(ConfigurationError, match=unreadable + ", got 'much'"):
        fiberexec.meta(memory="much")


def test_meta_memory_is_mib_as_in_fiber() -> None:
    """A program written for Fiber says ``@fiber.meta(memory=100)`` for 100 MB; a quantity
    says its own unit."""
    backend = _Recording()
    try:
        with mp.Pool(1, backend=backend) as pool:
            assert pool.map(tasks.fiber_heavy, [1, 2, 3]) == [2, 4, 6]
        assert {(s.resources.cpu, s.resources.memory) for s in backend.specs} == {(1, 100 << 20)}
    finally:
        backend.close()
    sizes = [mp.meta(memory=m)(lambda: None).__fiberexec_meta__.memory
             for m in (100, "100", "2Gi", "1G", None)]
    assert sizes == [100 << 20, 100 << 20, 2 << 30, 10**9, None]


@pytest.mark.parametrize("memory", [1, 0, -5, "5Mi", 1 << 31, True, 3.5])
def test_meta_memory_out_of_range_or_unreadable_is_refused_at_decoration(memory: object) -> None:
    """Below a worker's 16 MiB, a whole number so large it was meant as bytes, or not a
    number of MiB nor a quantity: refused where the function is decorated, naming the rule."""
    with pytest.raises(ConfigurationError, match=r"meta's memory must be .*got " + (
            "'5Mi'" if memory == "5Mi" else str(memory))):
        fiberexec.meta(memory=memory)  # type: ignore[arg-type]


def test_a_pool_refuses_a_function_whose_meta_its_workers_do_not_have() -> None:
    """A pool's workers start with the first function's resources: a function asking for
    others is refused, naming both (as Fiber's pool refused it), not run without them. A
    function with no `meta`, or the same, runs; so does any, on a pool given resources."""
    backend = _Recording()
    try:
        with mp.Pool(1, backend=backend) as pool:
            assert pool.map(tasks.heavy, [1]) == [2]
            assert pool.apply(abs, (-3,)) == 3
            assert pool.apply(tasks.heavy, (3,)) == 4
            with pytest.raises(RuntimeError, match=r"fiber_heavy needs cpu=1, memory=104857600, "
                                                   r"gpu=0 .*started with cpu=0.5, memory="
                                                   r"268435456, gpu=1"):
                pool.map(tasks.fiber_heavy, [1])
        with mp.Pool(1, backend=backend) as pool:
            pool.start_workers()
            with pytest.raises(RuntimeError, match="started with no resources asked"):
                pool.apply_async(tasks.heavy, (1,))
        with mp.Pool(1, backend=backend, cpu=1) as pool:  # its own: no function's meta counts
            assert pool.map(tasks.heavy, [1]) == [2]
            assert pool.map(tasks.fiber_heavy, [1]) == [2]
    finally:
        backend.close()
