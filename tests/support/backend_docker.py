"""Test support for the Docker backend: a running engine, the test image, a leak check.

The engine must already answer, unless ``CI`` is set or ``FIBEREXEC_DOCKER_START=1``, in which
case ``scripts/docker-engine.sh start`` is run first. The image is built (or found up to date)
by ``scripts/build-test-image.sh``; ``FIBEREXEC_DOCKER_IMAGE`` names another tag. Any failure
raises: a Docker test run never turns into a run of skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fiberexec.backend import LABEL_KEY, Backend, lease_name
from fiberexec.backends.docker import DockerBackend
from fiberexec.testing import Harness
from tests.support.kit import BackendKit

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SCRIPT = ROOT / "scripts" / "docker-engine.sh"
BUILD_SCRIPT = ROOT / "scripts" / "build-test-image.sh"
DEFAULT_IMAGE = "fiberexec-test:latest"


class DockerTestSetupError(RuntimeError):
    """The engine or the test image is not available; the message says how to fix it."""


def _run(script: Path, *args: str, timeout: float) -> str:
    try:
        done = subprocess.run(
            [str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DockerTestSetupError(f"{script.name} {' '.join(args)} took over {timeout}s") from exc
    if done.returncode != 0:
        raise DockerTestSetupError(
            f"{script.name} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout


def _connect() -> Any:
    import docker

    client = docker.from_env(timeout=30)
    client.ping()
    return client


def engine_client() -> Any:
    """A client of a live engine, starting one when allowed; raises when there is none."""
    try:
        return _connect()
    except Exception as first:
        if not (os.environ.get("CI") or os.environ.get("FIBEREXEC_DOCKER_START") == "1"):
            raise DockerTestSetupError(
                f"the Docker engine is unreachable ({first}); start it with "
                f"{ENGINE_SCRIPT.relative_to(ROOT)} start, or set FIBEREXEC_DOCKER_START=1"
            ) from first
    _run(ENGINE_SCRIPT, "start", timeout=600)
    try:
        return _connect()
    except Exception as exc:
        raise DockerTestSetupError(f"dockerd started but does not answer: {exc}") from exc


def ensure_image() -> str:
    """Build the test image, or reuse it when its inputs have not changed; return its tag."""
    tag = os.environ.get("FIBEREXEC_DOCKER_IMAGE", DEFAULT_IMAGE)
    _run(BUILD_SCRIPT, tag, timeout=1800)
    return tag


def list_leaks(client: Any) -> list[str]:
    """Containers labelled ``fiberexec`` that still exist, as ``name (status)`` lines.

    A container that has exited may still be in the daemon's auto-removal; it counts as a
    leak only if it is still there after a bounded wait for that removal.
    """
    return [
        f"container {c['Names'][0].lstrip('/')} ({c['Status']})"
        for c in client.api.containers(all=True, filters={"label": LABEL_KEY})
        if c["State"] == "running" or not _removed_soon(client, c["Id"])
    ]


def _removed_soon(client: Any, ref: str, timeout: float = 10.0) -> bool:
    import docker
    import requests

    try:
        client.api.wait(ref, condition="removed", timeout=timeout)
    except docker.errors.NotFound:
        return True
    except requests.exceptions.RequestException:  # still there after the timeout
        return False
    return True


@contextlib.contextmanager
def backend_session() -> Iterator[BackendKit]:
    """The `BackendKit` for the Docker backend (see tests/support/README.md)."""
    client = engine_client()
    try:
        image = ensure_image()

        # Tests hand workers paths under the temp dir (tmp_path): share it like the cwd.
        tmp = tempfile.gettempdir()
        shared = {"volumes": {tmp: {"bind": tmp, "mode": "rw"}}}

        def make_backend() -> Backend:
            return DockerBackend(image=image, extra_run_kwargs=shared)

        # Containers are auto-removed on exit, and their output with them (DockerBackend keeps
        # it only when it wins that race): logs after the exit are not part of its contract.
        def abandon(_: Backend, executor_id: str) -> None:  # as if its executor were killed
            client.api.remove_container(lease_name(executor_id), force=True)

        contract = Harness(make_backend=make_backend, memory_limits=True, logs_after_exit=False,
                           abandon=abandon)
        yield BackendKit(
            name="docker",
            make_backend=make_backend,
            leaks=lambda: list_leaks(client),
            contract=contract,
            executor_kwargs={"image": image},
            settings={"FIBEREXEC_BACKEND": "docker", "FIBEREXEC_IMAGE": image,
                      "FIBEREXEC_BACKEND_OPTIONS": json.dumps({"extra_run_kwargs": shared})},
        )
    finally:
        client.close()
