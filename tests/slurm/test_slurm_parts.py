"""The Slurm backend's pure parts: job records, state mapping, sbatch options, batching."""

from __future__ import annotations

import stat
import threading

import pytest

from fiberexec import ConfigurationError
from fiberexec.backend import (
    PermanentBackendError,
    Resources,
    TransientBackendError,
    WorkerSpec,
    WorkerState,
)
from fiberexec.backends import _slurm_cli as cli
from fiberexec.backends import _slurm_script as script
from fiberexec.backends._slurm_batch import Batcher
from fiberexec.backends._slurm_jobs import (
    JobRecord,
    cannot_start,
    decode_exit,
    decode_sacct_exit,
    expand_tasks,
    parse_sacct,
    parse_squeue,
    worker_status,
)


def _job(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"job_id": 7, "array_job_id": 0, "array_task_id": None,
                               "name": "fiberexec-ab", "job_state": "RUNNING",
                               "state_reason": "None", "exit_code": 0, "start_time": 5}
    return {**base, **fields}


def test_exit_codes_from_both_json_layouts_and_sacct() -> None:
    assert decode_exit(768) == 3  # 22.05: the raw wait status
    assert decode_exit(9) == -9
    assert decode_exit(0) == 0
    assert decode_exit({"status": "SIGNALED", "signal": {"signal_id": 15}}) == -15
    assert decode_exit({"status": "EXITED", "return_code": 2}) == 2
    assert decode_exit(None) is None
    assert (decode_sacct_exit("3:0"), decode_sacct_exit("0:9"), decode_sacct_exit("")) == (
        3, -9, None)


def test_pending_array_records_expand_to_one_per_task() -> None:
    assert expand_tasks("0-3,7,9-10%4") == [0, 1, 2, 3, 7, 9, 10]
    document = {"jobs": [
        _job(job_id=20, array_job_id=20, array_task_id=None, array_task_string="2-4",
             job_state="PENDING", state_reason="Resources", start_time=0),
        _job(job_id=21, array_job_id=20, array_task_id=0, job_state=["RUNNING"]),
        _job(job_id=22, array_job_id={"set": True, "number": 20},
             array_task_id={"set": True, "number": 1}, job_state="COMPLETED"),
        _job(job_id=30),
    ]}
    records = parse_squeue(document)
    assert sorted(records) == [(20, 0), (20, 1), (20, 2), (20, 3), (20, 4), (30, -1)]
    assert records[(20, 3)].state == "PENDING" and records[(20, 3)].reason == "Resources"
    assert records[(20, 3)].job_id == "20_3" and records[(30, -1)].job_id == "30"
    assert records[(20, 0)].state == "RUNNING" and records[(20, 1)].state == "COMPLETED"


def test_sacct_lines_parse_to_records() -> None:
    text = "12_3|fiberexec-ab|TIMEOUT|None|0:15|2026-01-01T00:00:00\n12_[4-5]|x|PENDING|" \
           "None|0:0|Unknown\n13|m|CANCELLED by 0|None|0:0|Unknown\n"
    records = parse_sacct(text)
    assert sorted(records) == [(12, 3), (13, -1)]
    assert records[(12, 3)].state == "TIMEOUT" and records[(12, 3)].exit_code == -15
    assert records[(13, -1)].state == "CANCELLED" and not records[(13, -1)].started


def _record(state: str, reason: str = "None", code: int | None = 0,
            started: bool = True) -> JobRecord:
    return JobRecord((1, 0), "fiberexec-ab", state, reason, code, started)


@pytest.mark.parametrize(("state", "code", "expected", "reason"), [
    ("COMPLETED", 0, WorkerState.EXITED, None),
    ("FAILED", 3, WorkerState.EXITED, None),
    ("CANCELLED", -15, WorkerState.EXITED, "CANCELLED"),
    ("TIMEOUT", -15, WorkerState.EXITED, "TIMEOUT"),
    ("OUT_OF_MEMORY", -9, WorkerState.EXITED, "OUT_OF_MEMORY"),
    ("NODE_FAIL", None, WorkerState.EXITED, "NODE_FAIL"),
    ("PREEMPTED", -15, WorkerState.EXITED, "PREEMPTED"),
    ("RUNNING", 0, WorkerState.RUNNING, None),
    ("COMPLETING", 0, WorkerState.RUNNING, None),
])
def test_slurm_states_map_to_worker_states(state: str, code: int | None,
                                           expected: WorkerState, reason: str | None) -> None:
    status = worker_status(_record(state, code=code))
    assert (status.state, status.reason) == (expected, reason)
    if expected is WorkerState.EXITED:
        assert status.exit_code == code


def test_pending_keeps_slurms_reason_and_never_run_jobs_fail() -> None:
    pending = worker_status(_record("PENDING", "Resources", started=False))
    assert (pending.state, pending.reason) == (WorkerState.PENDING, "Resources")
    cancelled = worker_status(_record("CANCELLED", started=False))
    assert cancelled.state is WorkerState.FAILED and "CANCELLED" in str(cancelled.reason)


def test_memory_kill_message_names_out_of_memory() -> None:
    tail = "slurmstepd-fx1: error: Exceeded job memory limit\n"
    status = worker_status(_record("FAILED", "JobLaunchFailure", code=-9), tail)
    assert (status.exit_code, status.reason) == (-9, "OUT_OF_MEMORY")
    assert status.describe() == "was killed by signal 9 (SIGKILL) (OUT_OF_MEMORY)"


def test_reasons_that_cannot_resolve() -> None:
    for reason in ("PartitionTimeLimit", "InvalidAccount", "InvalidQOS", "BadConstraints",
                   "QOSMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit"):
        assert cannot_start(reason), reason
    for reason in ("Resources", "Priority", "ReqNodeNotAvail", "QOSMaxJobsPerUserLimit",
                   "None", "Dependency"):
        assert not cannot_start(reason), reason


def test_resources_and_options_become_sbatch_directives(tmp_path: object) -> None:
    opts = script.SubmitOptions(partition="gpu", account="lab", qos="high", time_limit="1:00:00",
                                constraint="avx2", sbatch_options=("--exclusive",))
    directives = script.sbatch_directives(
        opts, Resources(cpu=1.5, memory=300 * 2**20, gpu=2), name="fiberexec-ab",
        note="fiberexec,executor=ab,batch=cd", tasks=8, output=tmp_path)  # type: ignore[arg-type]
    for expected in ("--array=0-7", "--partition=gpu", "--account=lab", "--qos=high",
                     "--time=1:00:00", "--constraint=avx2", "--cpus-per-task=2", "--mem=300M",
                     "--gres=gpu:2", "--exclusive", "--no-requeue", "--job-name=fiberexec-ab"):
        assert expected in directives, expected
    assert directives[-1] == "--exclusive"  # extra options come last, so they win


def test_bad_options_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="time_limit must be in Slurm's format"):
        script.SubmitOptions(time_limit="two hours")
    with pytest.raises(ConfigurationError, match="partition must be a Slurm name"):
        script.SubmitOptions(partition="a b")
    with pytest.raises(ConfigurationError, match="sbatch_options must be sbatch flags"):
        script.SubmitOptions(sbatch_options=("exclusive",))
    assert script.time_limit(1.5) == "2" and script.time_limit("1-0") == "1-0"


def test_staged_task_files_are_private_and_hold_the_secret_apart(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path)) / "batch"
    spec = WorkerSpec("w0", "ab", ("python", "-m", "fiberexec.worker"), env={"A": "1 2"},
                      secret_env={"FIBEREXEC_SECRET": "s3cr3t"}, workdir="/tmp")
    script.stage_batch(folder, [spec], "/usr/bin/python3", {"B": "x"})
    task, secret = (folder / "0.sh").read_text(), (folder / "0.secret").read_text()
    assert "s3cr3t" not in task and "export FIBEREXEC_SECRET=s3cr3t" in secret
    assert "export A='1 2'" in task and "export B=x" in task
    assert "exec /usr/bin/python3 -m fiberexec.worker" in task
    for path in (folder, folder / "0.sh", folder / "0.secret"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    text = script.batch_script(["--array=0-0"], folder)
    assert "s3cr3t" not in text and text.startswith("#!/bin/bash\n#SBATCH --array=0-0\n")


def test_batcher_turns_a_burst_into_few_batches() -> None:
    batches: list[list[int]] = []
    done = threading.Event()

    def submit(batch: list[int]) -> None:
        batches.append(batch)
        if sum(len(b) for b in batches) == 50:
            done.set()

    batcher: Batcher[int] = Batcher(submit, window=0.2, limit=32, name="test-batcher")
    for i in range(50):
        batcher.add(i)
    assert done.wait(10)
    assert batcher.close() == []
    assert [len(b) for b in batches] == [32, 18]
    assert [i for b in batches for i in b] == list(range(50))


def test_batcher_discard_and_close_return_what_never_went() -> None:
    gate = threading.Event()
    batcher: Batcher[int] = Batcher(lambda batch: gate.wait(5), window=30.0, limit=10,
                                    name="test-batcher")
    batcher.add(1)
    batcher.add(2)
    assert batcher.discard(1) and not batcher.discard(7)
    assert batcher.close() == [2]
    with pytest.raises(RuntimeError, match="after close"):
        batcher.add(3)


def test_command_failures_are_classified() -> None:
    busy = cli.classify("submit", "sbatch: error: Batch job submission failed: Socket timed "
                                  "out on send/recv operation", 1)
    assert isinstance(busy, TransientBackendError)
    refused = cli.classify("submit", "sbatch: error: invalid partition specified: nope", 1)
    assert isinstance(refused, PermanentBackendError) and "nope" in str(refused)
    with pytest.raises(PermanentBackendError, match="not found; install Slurm"):
        cli.run(["fiberexec-no-such-sbatch"], what="submit", timeout=5)
