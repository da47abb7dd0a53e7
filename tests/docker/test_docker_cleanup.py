"""``fiberexec cleanup`` on a shared engine: live executors' workers stay, a killed one's go.

Each executor runs in a process of its own (``tests.support.lease_executor``) and is ended
with SIGKILL, as a crash would end it. Its workers are paused first: a worker notices its
executor's end and exits by itself, so only a paused one (as a worker cut off from its
executor is, until its silence timeout) is left for ``cleanup`` to find.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fiberexec.backend import EXECUTOR_LABEL, LABEL_KEY, lease_name
from tests.support.lease_executor import Executor, executors

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def start_executor(image: str) -> Iterator[Callable[[], Executor]]:
    with executors("docker", {}, {"image": image}, os.environ) as start:
        yield start


def _workers(client: Any, executor_id: str) -> list[str]:
    """Ids of the executor's worker containers, running or paused."""
    found = client.api.containers(filters={"label": [f"{LABEL_KEY}=worker",
                                                     f"{EXECUTOR_LABEL}={executor_id}"]})
    return sorted(c["Id"] for c in found)


def _exists(client: Any, ref: str) -> bool:
    return any(c["Id"] == ref for c in client.api.containers(all=True))


def _cleanup(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fiberexec", "cleanup", "--backend", "docker",
                           *args], capture_output=True, text=True, timeout=120, check=False,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait_removed(client: Any, name: str) -> None:
    import docker

    try:
        client.api.wait(name, condition="removed", timeout=30)
    except docker.errors.NotFound:
        pass  # already gone


def test_cleanup_spares_live_executors_and_removes_a_killed_ones_workers(
    client: Any, start_executor: Callable[[], Executor],
) -> None:
    (dead, dead_id), (_, live_id) = start_executor(), start_executor()
    dead_workers, live_workers = _workers(client, dead_id), _workers(client, live_id)
    assert dead_workers and live_workers
    for ref in dead_workers:
        client.api.pause(ref)  # it cannot notice its executor's end, nor exit
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    _wait_removed(client, lease_name(dead_id))  # the engine ends the lease with the process

    said = _cleanup()
    assert _workers(client, live_id) == live_workers, f"a live executor lost workers:\n{said}"
    assert live_id not in said
    for ref in dead_workers:
        assert not _exists(client, ref), f"a killed executor's worker survived:\n{said}"
    assert f"of executor {dead_id}: its executor's lease is gone" in said, said


def test_cleanup_executor_removes_one_and_all_says_what_first(
    client: Any, start_executor: Callable[[], Executor],
) -> None:
    (_, first), (_, second) = start_executor(), start_executor()
    firsts, seconds = _workers(client, first), _workers(client, second)

    said = _cleanup("--executor", first, "--force")  # it runs: forced
    assert not any(_exists(client, ref) for ref in firsts), said
    assert f"lease of executor {first}" in said, said
    assert _workers(client, second) == seconds, f"--executor took another's workers:\n{said}"

    said = _cleanup("--all", "--yes")  # no terminal to ask on
    lines = said.splitlines()
    assert lines[0].startswith("--all removes every fiberexec worker"), said
    listed = [i for i, line in enumerate(lines) if "would remove" in line and second in line]
    removed = [i for i, line in enumerate(lines) if "docker: removed" in line and second in line]
    assert listed and removed and max(listed) < min(removed), said
    assert not any(_exists(client, ref) for ref in seconds), said
