"""What a pip user reads when the Docker engine cannot be reached: a hint that works without
the source tree (collected in the docker env, where the Docker client is installed)."""

from __future__ import annotations

import gc
import warnings

import pytest

from fiberexec.backend import TransientBackendError, WorkerSpec
from fiberexec.backends.docker import DockerBackend


def test_docker_engine_hint_works_without_the_source_tree() -> None:
    url = "unix:///tmp/fiberexec-no-such-docker.sock"
    spec = WorkerSpec("w0", "hint-test", ("true",))
    with DockerBackend(image="any", base_url=url) as backend, \
            pytest.raises(TransientBackendError) as caught:
        backend.start_worker(spec)
    message = str(caught.value)
    del caught
    with warnings.catch_warnings():  # docker-py leaks the socket whose connect() failed
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert "scripts/" not in message
    assert "sudo systemctl start docker" in message and "dockerd" in message
    assert "DOCKER_HOST" in message
