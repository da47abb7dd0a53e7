"""Fixtures for the Kubernetes adapter tests: a fresh emulator and backends closed after use."""

from __future__ import annotations

import itertools
import queue
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fiberexec.backend import WorkerHandle, WorkerSpec, WorkerStatus
from tests.k8s.emulator import Emulator
from tests.support.backend_kubernetes import IMAGE, NAMESPACE, leaks

_ids = itertools.count()


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(namespaces=[NAMESPACE, "default"]) as emulator:
        yield emulator
        left = emulator.running_processes()
    assert not left, f"the emulator still ran pod processes after the test: {left}"


@pytest.fixture
def client(emu: Emulator) -> Iterator[Any]:
    api_client = emu.api_client()
    yield api_client
    api_client.close()


@pytest.fixture
def make_backend(emu: Emulator, client: Any) -> Iterator[Callable[..., Any]]:
    """Build KubernetesBackends on the emulator; close them and check nothing leaked."""
    from fiberexec.backends.kubernetes import KubernetesBackend

    made: list[KubernetesBackend] = []

    def make(**options: Any) -> KubernetesBackend:
        options = {"api_client": client, "namespace": NAMESPACE, "image": IMAGE,
                   "advertise_host": "127.0.0.1", **options}
        backend = KubernetesBackend(**options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
    assert not leaks(emu), f"leaked: {leaks(emu)}"


def make_spec(*command: str, executor_id: str = "ex1", **fields: Any) -> WorkerSpec:
    worker_id = fields.pop("worker_id", f"w{next(_ids)}")
    return WorkerSpec(worker_id=worker_id, executor_id=executor_id,
                      command=command or ("python", "-c", "pass"), **fields)


class Exits:
    """Collects ``watch`` reports; `next` blocks on a queue (no polling)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[WorkerHandle, WorkerStatus]] = queue.Queue()

    def __call__(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        self._queue.put((handle, status))

    def next(self, timeout: float = 10.0) -> WorkerStatus:
        try:
            return self._queue.get(timeout=timeout)[1]
        except queue.Empty:
            raise AssertionError(f"no worker exit reported within {timeout}s") from None

    def empty(self) -> bool:
        return self._queue.empty()


@pytest.fixture
def exits() -> Exits:
    return Exits()
