"""The Slurm adapter against the real test cluster: arrays, secrets, states, cleanup."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor
from fiberexec.backend import (
    PermanentBackendError,
    Resources,
    RetryPolicy,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)
from fiberexec.backends._slurm_jobs import expand_tasks
from fiberexec.backends.slurm import SlurmBackend
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_slurm import active_fiberexec_jobs, jobs, wait_for
from tests.support.kit import BackendKit

ROOT = Path(__file__).resolve().parents[2]
SLEEP = ("python", "-c", "import time; time.sleep(300)")


def _spec(executor: str, worker: str, command: tuple[str, ...] = SLEEP,
          **fields: Any) -> WorkerSpec:
    return WorkerSpec(worker_id=worker, executor_id=executor, command=command,
                      workdir=str(ROOT), **fields)


class Exits:
    """Collects watch reports; ``wait(worker_id)`` blocks until that worker's arrives."""

    def __init__(self) -> None:
        self.seen: dict[str, WorkerStatus] = {}
        self.cond = threading.Condition()

    def __call__(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        with self.cond:
            self.seen[handle.worker_id] = status
            self.cond.notify_all()

    def wait(self, worker_id: str, timeout: float) -> WorkerStatus:
        with self.cond:
            assert self.cond.wait_for(lambda: worker_id in self.seen, timeout), (
                f"no exit reported for {worker_id} within {timeout}s")
            return self.seen[worker_id]


def _running(backend: SlurmBackend, handle: WorkerHandle, timeout: float = 30) -> None:
    assert wait_for(lambda: backend.status(handle).state is WorkerState.RUNNING, timeout), (
        backend.status(handle))


def _job_id(executor: str, index: int) -> str:
    for job in jobs():  # a queued array not split yet is one record: "0-7" in task_string
        tasks = [job["array_task_id"]] if job["array_task_id"] is not None else expand_tasks(
            job["array_task_string"])
        if job["name"] == f"fiberexec-{executor}" and index in tasks:
            return f"{job['array_job_id']}_{index}"
    raise AssertionError(f"no task {index} of fiberexec-{executor} in squeue")


def test_many_workers_start_as_one_job_array(kit: BackendKit,
                                             make_executor: ExecutorFactory) -> None:
    backend = kit.make_backend(batch_window=0.5)  # type: ignore[call-arg]
    ex = make_executor(8, backend=backend)
    ids = set(ex.map(tasks.sleep_return, [1.0] * 8, [None] * 8, timeout=120))
    assert ids == {None}
    ours = [j for j in jobs() if j["name"] == f"fiberexec-{ex.executor_id}"]  # type: ignore[union-attr]
    assert len(ours) == 8, ours
    assert len({j["array_job_id"] for j in ours}) == 1, "8 workers must be ONE sbatch --array"
    assert sorted(j["array_task_id"] for j in ours) == list(range(8))
    backend.close()


def test_secret_reaches_the_worker_but_no_job_description(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend()  # type: ignore[assignment]
    token, executor = secrets.token_hex(32), secrets.token_hex(4)
    show = ("python", "-c", "import os, time; s = os.environ['FIBEREXEC_SECRET']; "
                            "print('secret length', len(s), flush=True); time.sleep(300)")
    try:
        handle = backend.start_worker(_spec(executor, "w0", show,
                                            secret_env={"FIBEREXEC_SECRET": token}))
        _running(backend, handle)
        assert wait_for(lambda: "secret length 64" in backend.logs(handle), 30)
        job = _job_id(executor, 0)
        views = [["squeue", "--json"], ["squeue", "-o", "%all"],
                 ["scontrol", "show", "job", "-dd", job],
                 ["scontrol", "write", "batch_script", job, "-"]]
        for argv in views:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                                 check=True).stdout
            assert out.strip(), argv
            assert token not in out, f"{' '.join(argv)} shows the secret"
        staging = next(Path(backend.staging_root).glob(f"{executor}-*"))
        assert not list(staging.rglob("*.secret")), "a started task must delete its secret"
        assert not any(token in p.read_text() for p in staging.rglob("*.sh"))
    finally:
        backend.close()
    assert not list(Path(backend.staging_root).glob(f"{executor}-*")), "staging dir left"


def test_secret_of_a_queued_task_is_private_and_removed_by_stop(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend(sbatch_options=["--hold"])  # type: ignore[call-arg]
    executor = secrets.token_hex(4)
    try:
        handle = backend.start_worker(_spec(executor, "w0", secret_env={"FIBEREXEC_SECRET": "k"}))
        assert wait_for(lambda: backend.status(handle).reason == "JobHeldUser", 30)
        [secret] = list(Path(backend.staging_root).glob(f"{executor}-*/*/0.secret"))
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        backend.stop(handle)
        assert not secret.exists()
    finally:
        backend.close()


def test_resources_and_options_reach_slurm(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend(  # type: ignore[call-arg]
        partition="debug", time_limit=5, sbatch_options=["--hold"])
    executor = secrets.token_hex(4)
    try:
        handle = backend.start_worker(_spec(
            executor, "w0", resources=Resources(cpu=2, memory=300 * 2**20)))
        assert wait_for(lambda: backend.status(handle).reason == "JobHeldUser", 30)
        shown = subprocess.run(["scontrol", "show", "job", _job_id(executor, 0)],
                               capture_output=True, text=True, timeout=30, check=True).stdout
        for expected in ("NumCPUs=2", "mem=300M", "TimeLimit=00:05:00", "Partition=debug",
                         f"Comment=fiberexec,executor={executor}"):
            assert expected in shown, expected
    finally:
        backend.close()


def test_exit_code_output_and_stop(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend()  # type: ignore[assignment]
    executor, exits = secrets.token_hex(4), Exits()
    fail = ("python", "-c", "import sys; print('about to fail', flush=True); sys.exit(3)")
    try:
        failing = backend.start_worker(_spec(executor, "w0", fail))
        sleeping = backend.start_worker(_spec(executor, "w1"))
        backend.watch(failing, exits)
        backend.watch(sleeping, exits)
        status = exits.wait("w0", 60)
        assert (status.state, status.exit_code, status.reason) == (WorkerState.EXITED, 3, None)
        assert "about to fail" in backend.logs(failing)
        _running(backend, sleeping)
        backend.stop(sleeping)
        assert wait_for(lambda: not active_fiberexec_jobs(f"fiberexec-{executor}"), 30)
        assert "w1" not in exits.seen, "a stopped worker is not reported as an exit"
    finally:
        backend.close()


def test_request_no_node_can_meet_fails_fast_and_for_good(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend()  # type: ignore[assignment]
    executor, exits = secrets.token_hex(4), Exits()
    try:
        handle = backend.start_worker(_spec(executor, "w0", resources=Resources(gpu=1)))
        backend.watch(handle, exits)
        status = exits.wait("w0", 30)
        assert status.state is WorkerState.FAILED and "gres" in str(status.reason).lower()
        with pytest.raises(PermanentBackendError, match="Slurm refused"):
            backend.start_worker(_spec(executor, "w1"))
    finally:
        backend.close()


def test_invalid_partition_breaks_the_executor_with_slurms_words(kit: BackendKit) -> None:
    backend = kit.make_backend(partition="nosuchpartition")  # type: ignore[call-arg]
    ex = FiberExecutor(1, backend=backend)
    try:
        with pytest.raises(BrokenFiberExecutor, match="(?i)invalid partition"):
            ex.submit(tasks.square, 2).result(timeout=60)
    finally:
        ex.shutdown()
        backend.close()


def test_job_pending_for_a_hopeless_reason_fails_fast(kit: BackendKit) -> None:
    # The "short" partition allows 1 minute; a 10-minute job waits there forever.
    backend = kit.make_backend(partition="short", time_limit=10)  # type: ignore[call-arg]
    ex = FiberExecutor(1, backend=backend, start_timeout=300)
    try:
        hopeless = r"PENDING \((PartitionTimeLimit|PartitionConfig)\) and cannot start"
        with pytest.raises(BrokenFiberExecutor, match=hopeless):
            ex.submit(tasks.square, 2).result(timeout=60)
    finally:
        ex.shutdown()
        backend.close()


def test_pending_workers_wait_while_the_executor_works(make_executor: ExecutorFactory) -> None:
    # Each worker takes more than half a 16-CPU node: two run, one a node, and the third
    # waits for a free node (one CPU of a node may be taken: tests/slurm/conftest.py)
    ex = make_executor(3, cpu=9)
    assert list(ex.map(tasks.sleep_return, [0.3] * 12, range(12), timeout=120)) == list(
        range(12))
    executor = ex.executor_id
    states = sorted((j["job_state"], j["state_reason"]) for j in jobs()
                    if j["name"] == f"fiberexec-{executor}")
    assert states.count(("RUNNING", "None")) == 2, states
    assert ("PENDING", "Resources") in states, states
    assert ex.stats().workers == 2


SHIM = """#!/bin/bash
# sbatch as a busy controller answers it once: {mode}
marker={marker}
if [ ! -e "$marker" ]; then
    touch "$marker"
    {first}
    echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
    exit 1
fi
exec {sbatch} "$@"
"""


@pytest.mark.parametrize("mode", ["refused", "accepted"])
def test_submission_timeout_is_retried_without_a_duplicate_array(
        kit: BackendKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # "accepted": the controller took the job but the answer was lost, as after a timeout.
    real = shutil.which("sbatch")
    assert real is not None
    first = f'{real} "$@" >/dev/null' if mode == "accepted" else ":"
    shim = tmp_path / "bin" / "sbatch"
    shim.parent.mkdir()
    shim.write_text(SHIM.format(mode=mode, marker=tmp_path / "failed-once", first=first,
                                sbatch=real))
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    backend: SlurmBackend = kit.make_backend(  # type: ignore[call-arg]
        retry=RetryPolicy(attempts=3, deadline=30, initial=0.05))
    executor, exits = secrets.token_hex(4), Exits()
    try:
        handle = backend.start_worker(_spec(executor, "w0", ("python", "-c", "print('ran')")))
        backend.watch(handle, exits)
        assert exits.wait("w0", 60).exit_code == 0
        assert (tmp_path / "failed-once").exists(), "the shim never answered 'timed out'"
        ours = [j for j in jobs() if j["name"] == f"fiberexec-{executor}"]
        assert len(ours) == 1, f"one worker must be one job, got {len(ours)}"
    finally:
        backend.close()


GUARDED = textwrap.dedent("""
    import sys
    from fiberexec.backend import WorkerSpec
    from fiberexec.backends.slurm import SlurmBackend
    backend = SlurmBackend(advertise_host="127.0.0.1", staging_dir=sys.argv[1])
    for i in range(2):
        backend.start_worker(WorkerSpec(f"w{i}", sys.argv[2], ("sleep", "300")))
    print("submitted", flush=True)
    sys.stdin.read()
""")


def test_owner_killed_its_jobs_are_cancelled(tmp_path: Path) -> None:
    executor = secrets.token_hex(4)
    with subprocess.Popen([sys.executable, "-c", GUARDED, str(tmp_path), executor],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "submitted"
            assert wait_for(lambda: len(active_fiberexec_jobs(f"fiberexec-{executor}")) == 2,
                            30)
            os.kill(proc.pid, signal.SIGKILL)  # no finally, no atexit: only the guard can act
            proc.wait(timeout=10)
            assert wait_for(lambda: not active_fiberexec_jobs(f"fiberexec-{executor}"), 30)
            assert wait_for(lambda: not list(tmp_path.glob(f"{executor}-*")), 10)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_cleanup_command_cancels_stray_jobs(kit: BackendKit) -> None:
    backend: SlurmBackend = kit.make_backend()  # type: ignore[assignment]
    executor = secrets.token_hex(4)
    try:
        handle = backend.start_worker(_spec(executor, "w0"))
        _running(backend, handle)
        done = subprocess.run(
            [sys.executable, "-m", "fiberexec", "cleanup", "--backend", "slurm", "--executor",
             executor], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
        assert done.returncode == 0, done.stderr
        assert "slurm: cancelled 1 worker job(s)" in done.stdout
        assert wait_for(lambda: not active_fiberexec_jobs(f"fiberexec-{executor}"), 30)
    finally:
        backend.close()
