"""Chaos through the executor on a real engine: containers killed, the executor killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor
from fiberexec.backend import EXECUTOR_LABEL, LABEL_KEY
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_docker import engine_client
from tests.support.kit import BackendKit

ROOT = Path(__file__).resolve().parents[2]


def _worker_containers(executor_id: str | None = None, *, lease: bool = False) -> list[str]:
    """Ids of one executor's worker containers (or anyone's), running or stopped; with
    ``lease``, its lease container too.

    The low-level listing: the high-level one inspects each container after listing, which
    races with auto-removal, the very thing these tests provoke.
    """
    labels = [f"{EXECUTOR_LABEL}={executor_id}" if executor_id else LABEL_KEY]
    if not lease:
        labels.append(f"{LABEL_KEY}=worker")
    found = engine_client().api.containers(all=True, filters={"label": labels})
    return [str(c["Id"]) for c in found]


def test_docker_kill_of_busy_container_mid_map(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2)
    results = ex.map(tasks.sleep_return, [0.05] * 60, range(60), timeout=120)
    assert next(results) == 0  # both containers are up and busy
    victim = _worker_containers(ex.executor_id)[0]  # type: ignore[union-attr]
    engine_client().api.kill(victim)  # docker kill: SIGKILL from the engine
    assert list(results) == list(range(1, 60)), "results must be complete and in order"
    stats = ex.stats()
    assert stats.workers_lost >= 1 and stats.tasks_failed == 0


def test_missing_image_fails_clearly_without_hanging(kit: BackendKit) -> None:
    backend = kit.make_backend()
    ex = FiberExecutor(1, backend=backend, image="fiberexec-no-such-image:0")
    try:
        with pytest.raises(BrokenFiberExecutor, match="fiberexec-no-such-image:0"):
            ex.submit(tasks.square, 2).result(timeout=60)
    finally:
        ex.shutdown()
        backend.close()


MASTER = textwrap.dedent("""
    import logging, sys, threading
    from fiberexec import FiberExecutor
    from fiberexec.backends.docker import DockerBackend
    from tests import tasks

    connected = threading.Semaphore(0)

    class Connected(logging.Handler):
        def emit(self, record):
            if "connected" in record.getMessage():
                connected.release()

    logger = logging.getLogger("fiberexec")
    logger.addHandler(Connected())
    logger.setLevel(logging.INFO)
    ex = FiberExecutor(2, backend=DockerBackend(image=sys.argv[1]), heartbeat=0.5)
    futures = [ex.submit(tasks.sleep_return, 60) for _ in range(4)]
    for _ in range(2):
        assert connected.acquire(timeout=120), "workers never connected"
    print(ex.executor_id, flush=True)
    threading.Event().wait(120)
""")


def test_executor_killed_leaves_no_container(kit: BackendKit) -> None:
    image = kit.executor_kwargs["image"]
    master = subprocess.Popen(
        [sys.executable, "-c", MASTER, image], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert master.stdout is not None
        executor_id = master.stdout.readline().strip()
        assert executor_id, "the master never got its workers up"
        assert len(_worker_containers(executor_id)) == 2
    finally:
        master.send_signal(signal.SIGKILL)
        master.wait(timeout=10)
        if master.stdout is not None:
            master.stdout.close()
    import docker.errors

    for container in _worker_containers(executor_id, lease=True):
        try:  # the engine tells us when the container is removed; 10 s at most
            engine_client().api.wait(container, condition="removed", timeout=10)
        except docker.errors.NotFound:
            pass  # already removed
    assert _worker_containers(executor_id, lease=True) == []  # the lease went with it
