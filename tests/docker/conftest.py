"""Fixtures for the Docker adapter tests, which run only with ``FIBEREXEC_TEST_BACKEND=docker``.

With that variable set, an unreachable engine or a failed image build is an error, never a
skip. Each test gets its own executor id, and a test that leaves a container labelled with it
fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fiberexec.backend import EXECUTOR_LABEL, WorkerSpec
from fiberexec.backends.docker import DockerBackend

ENABLED = os.environ.get("FIBEREXEC_TEST_BACKEND", "local") == "docker"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="Docker adapter tests run with FIBEREXEC_TEST_BACKEND=docker")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def client() -> Iterator[Any]:
    from tests.support.backend_docker import engine_client

    engine = engine_client()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def image(client: Any) -> str:
    from tests.support.backend_docker import ensure_image

    return ensure_image()


@pytest.fixture
def executor_id(client: Any) -> Iterator[str]:
    """A fresh executor id; the test fails if a container labelled with it survives."""
    ident = f"t{uuid.uuid4().hex[:10]}"
    yield ident
    left = client.api.containers(all=True, filters={"label": f"{EXECUTOR_LABEL}={ident}"})
    for container in left:
        client.api.remove_container(container["Id"], force=True)
    assert not left, f"containers left behind: {[c['Names'] for c in left]}"


@pytest.fixture
def backend(image: str, executor_id: str) -> Iterator[DockerBackend]:
    with DockerBackend(image=image, stop_grace=1.0) as docker_backend:
        assert isinstance(docker_backend, DockerBackend)
        yield docker_backend


@pytest.fixture
def make_spec(executor_id: str) -> Callable[..., WorkerSpec]:
    counter = iter(range(1_000_000))

    def make(*command: str, **fields: Any) -> WorkerSpec:
        worker_id = fields.pop("worker_id", f"w{next(counter)}")
        return WorkerSpec(worker_id, executor_id, command, **fields)

    return make
