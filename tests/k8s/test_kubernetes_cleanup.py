"""``fiberexec cleanup`` in a shared namespace: live executors' pods stay, a killed one's go.

Each executor runs in a process of its own (``tests.support.lease_executor``) against the
emulator and is ended with SIGKILL, as a crash would end it: its Lease is no longer renewed,
and once it has lapsed ``cleanup`` (run as the command, from another process) takes its pods.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from fiberexec.backend import EXECUTOR_LABEL, lease_name
from tests.k8s.emulator import Emulator
from tests.k8s.test_kubernetes_cli import _kubeconfig
from tests.support.backend_kubernetes import IMAGE, NAMESPACE
from tests.support.lease_executor import Executor, executors

pytestmark = pytest.mark.skipif(
    os.environ.get("FIBEREXEC_TEST_BACKEND") != "kubernetes",
    reason="Kubernetes adapter tests run with FIBEREXEC_TEST_BACKEND=kubernetes",
)
ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 2


@pytest.fixture
def environ(emu: Emulator, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT),
            "KUBECONFIG": str(_kubeconfig(emu, tmp_path / "config"))}


@pytest.fixture
def start_executor(environ: dict[str, str]) -> Iterator[Callable[[], Executor]]:
    options = {"namespace": NAMESPACE, "image": IMAGE, "advertise_host": "127.0.0.1",
               "lease_duration": LEASE_SECONDS}
    with executors("kubernetes", options, {}, environ) as start:
        yield start


def _pods(emu: Emulator, executor_id: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in
                  emu.pods(NAMESPACE, selector=f"{EXECUTOR_LABEL}={executor_id}"))


def _cleanup(environ: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fiberexec", "cleanup", "--backend", "kubernetes",
         "--namespace", NAMESPACE, *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT, env=environ)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _await_lapse(emu: Emulator, executor_id: str, killed_at: float) -> None:
    """Wait (once, to a deadline) until the killed executor's Lease has lapsed."""
    lease = emu.store.get("leases", NAMESPACE, lease_name(executor_id))
    assert lease is not None, "the executor held no Lease"
    renewed = datetime.fromisoformat(lease["spec"]["renewTime"]).timestamp()
    assert renewed <= killed_at + 0.5, "the Lease was renewed after its executor was killed"
    expires = renewed + lease["spec"]["leaseDurationSeconds"]
    threading.Event().wait(max(0.0, expires - time.time()) + 0.2)


def test_cleanup_spares_live_executors_and_removes_a_killed_ones_pods(
    emu: Emulator, environ: dict[str, str], start_executor: Callable[[], Executor],
) -> None:
    (dead, dead_id), (_, live_id) = start_executor(), start_executor()
    dead_pods, live_pods = _pods(emu, dead_id), _pods(emu, live_id)
    assert dead_pods and live_pods
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    _await_lapse(emu, dead_id, time.time())

    said = _cleanup(environ)
    assert _pods(emu, live_id) == live_pods, f"a live executor lost pods:\n{said}"
    assert live_id not in said
    assert _pods(emu, dead_id) == [], f"a killed executor's pods survived:\n{said}"
    assert f"of executor {dead_id}: its executor's lease is gone" in said, said
    assert emu.store.get("leases", NAMESPACE, lease_name(dead_id)) is None, said


def test_cleanup_executor_removes_one_and_all_says_what_first(
    emu: Emulator, environ: dict[str, str], start_executor: Callable[[], Executor],
) -> None:
    (_, first), (_, second) = start_executor(), start_executor()
    firsts, seconds = _pods(emu, first), _pods(emu, second)

    said = _cleanup(environ, "--executor", first, "--force")  # it runs: forced
    assert not set(firsts) & set(_pods(emu, first)), said
    assert _pods(emu, second) == seconds, f"--executor took another's pods:\n{said}"

    said = _cleanup(environ, "--all", "--yes")  # no terminal to ask on
    lines = said.splitlines()
    assert lines[0].startswith("--all removes every fiberexec worker"), said
    listed = [i for i, line in enumerate(lines) if "would remove pod" in line and second in line]
    removed = [i for i, line in enumerate(lines) if ": removed pod" in line and second in line]
    assert listed and removed and max(listed) < min(removed), said
    assert not set(seconds) & set(_pods(emu, second)), said
