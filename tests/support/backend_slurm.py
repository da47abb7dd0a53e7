"""Test support for the Slurm backend: a real one-machine cluster, a leak check on its queue.

The cluster (``scripts/slurm-cluster.sh``) must be up and ``SLURM_CONF`` must name its
configuration, unless ``CI`` is set or ``FIBEREXEC_SLURM_START=1``, in which case the script
is run first. Any failure raises: a Slurm test run never turns into a run of skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fiberexec.backend import Backend, Sweep
from fiberexec.backends.slurm import SlurmBackend
from fiberexec.testing import Harness
from tests.support.kit import BackendKit

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
DEFAULT_CONF = "/var/lib/fiberexec-slurm/slurm.conf"
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}


class SlurmTestSetupError(RuntimeError):
    """The test cluster is not available; the message says how to fix it."""


def _cluster(*args: str, timeout: float) -> str:
    try:
        done = subprocess.run(["bash", str(CLUSTER_SCRIPT), *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmTestSetupError(f"slurm-cluster.sh {' '.join(args)} took over {timeout}s") \
            from exc
    if done.returncode != 0:
        raise SlurmTestSetupError(f"slurm-cluster.sh {' '.join(args)} failed "
                                  f"({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def ensure_cluster() -> None:
    """Make sure the test cluster answers, starting it when allowed; raise when it cannot."""
    os.environ.setdefault("SLURM_CONF", DEFAULT_CONF)
    try:
        _cluster("status", timeout=30)
        return
    except SlurmTestSetupError as first:
        if not (os.environ.get("CI") or os.environ.get("FIBEREXEC_SLURM_START") == "1"):
            raise SlurmTestSetupError(
                f"the Slurm test cluster is not up ({first}); start it with "
                "scripts/slurm-cluster.sh start, or set FIBEREXEC_SLURM_START=1") from first
    _cluster("start", timeout=900)


def jobs() -> list[dict[str, Any]]:
    """Every job slurmctld still knows (squeue --json; 22.05 ignores its filters)."""
    out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found: list[dict[str, Any]] = json.loads(out)["jobs"]
    return found


# executors whose jobs a test keeps running across tests on purpose (tests/slurm/conftest.py)
RESERVED: set[str] = set()


def active_fiberexec_jobs(name: str = "fiberexec-") -> list[dict[str, Any]]:
    reserved = {f"fiberexec-{executor}" for executor in RESERVED}
    return [j for j in jobs() if str(j["name"]).startswith(name) and j["job_state"] in ACTIVE
            and j["name"] not in reserved]


def wait_for(predicate: Any, timeout: float, interval: float = 0.2) -> bool:
    """Bounded wait on an outside system with no event to block on (the Slurm queue)."""
    deadline, wake = time.monotonic() + timeout, threading.Event()
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        wake.wait(interval)
    return True


def list_leaks() -> list[str]:
    """fiberexec jobs still queued or running, after a bounded wait for ones completing.

    Leaked jobs are cancelled after being reported, so one leak fails one test only.
    """
    wait_for(lambda: not active_fiberexec_jobs(), timeout=10)
    left = active_fiberexec_jobs()
    if left:
        ids = sorted({str(j["array_job_id"] or j["job_id"]) for j in left})
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
    return [f"slurm job {j['job_id']} {j['name']} ({j['job_state']})" for j in left]


def _remove_stray(_backend: Backend, sweep: Sweep) -> list[str]:
    """Workers are submitted in batches a moment after start_worker: a stray exists for
    Slurm (and remove_stray) once its job is queued."""
    prefix = f"fiberexec-{sweep.executor_id or ''}"
    queued = wait_for(lambda: active_fiberexec_jobs(prefix), 60)
    assert queued, f"no job named {prefix}* was queued within 60s"
    return SlurmBackend.remove_stray(sweep)


@contextlib.contextmanager
def backend_session() -> Iterator[BackendKit]:
    """The `BackendKit` for the Slurm backend (see tests/support/README.md)."""
    ensure_cluster()
    with tempfile.TemporaryDirectory(prefix="fiberexec-slurm-") as staging:

        def make_backend(**options: Any) -> Backend:
            options = {"advertise_host": "127.0.0.1", "poll_interval": 0.25,
                       "staging_dir": staging, **options}
            return SlurmBackend(**options)

        # Slurm polls: exits are seen within a few squeue rounds, not at once.
        contract = Harness(make_backend=make_backend, timeout=120.0,
                           remove_stray=_remove_stray)
        yield BackendKit(name="slurm", make_backend=make_backend, leaks=list_leaks,
                         contract=contract)
