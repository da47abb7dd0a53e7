"""What a pip user reads when the Docker engine cannot be reached: a hint that works without
the source tree (collected in the docker env, where the Docker client is installed)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from pathlib import Path

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


def test_run_on_docker_without_an_engine_says_so_in_one_line(tmp_path: Path) -> None:
    """``fiberexec run`` pings the engine first: one line, exit 1, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBEREXEC_")}
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-engine.sock"
    result = subprocess.run([sys.executable, "-m", "fiberexec", "run", "--backend", "docker",
                             "--image", "me/app:1", "--", "python", "x.py"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("fiberexec run: cannot run the program on Docker: no engine")
    assert "start a Docker engine" in result.stderr and len(result.stderr.splitlines()) == 1
