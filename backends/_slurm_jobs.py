"""Slurm job records: parsing ``squeue --json`` and ``sacct`` output, and their meaning.

Pure functions, no I/O. `parse_squeue` accepts both JSON layouts Slurm has shipped: 22.05's
(openapi v0.0.38: ``job_state`` a string, ``exit_code`` the raw wait status) and the later one
(v0.0.39+: ``job_state`` a list, ``exit_code`` an object with ``return_code`` and ``signal``).
A pending array that Slurm has not split yet is one record covering many task ids
(``array_task_string`` such as ``"3-31%8"``); it is expanded to one record per task.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fiberexec.backend import WorkerState, WorkerStatus

#: Task of an array job: (array job id, task index). A plain job is (job id, -1).
TaskKey = tuple[int, int]

_PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                      "RESV_DEL_HOLD"})
_RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING",
                      "SUSPENDED", "STOPPED"})
#: Pending reasons that no amount of waiting resolves: the job itself is at odds with the
#: cluster's configuration, limits or accounts. Their ``...PerJob...`` siblings (a single job
#: over a per-job limit) are matched by `cannot_start`.
_HOPELESS = frozenset({
    "BadConstraints", "InvalidAccount", "InvalidQOS", "PartitionNodeLimit",
    "PartitionTimeLimit", "PartitionConfig", "DependencyNeverSatisfied", "AccountNotAllowed",
    "QOSNotAllowed", "FrontEndDown",
})
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)Max\w*Per(Job|Node)\w*Limit$")
_MEMORY_KILL = re.compile(r"Exceeded job memory limit|exceeded memory limit|oom[-_ ]kill",
                          re.IGNORECASE)
_SIGNAL_BIT = 0x7F  # a raw wait status: low 7 bits = signal, next 8 bits = exit code


@dataclass(frozen=True)
class JobRecord:
    """One job or array task as Slurm reports it."""

    key: TaskKey
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...
    reason: str  # Slurm's state reason: "Resources", "PartitionTimeLimit", "None", ...
    exit_code: int | None  # negative for a signal, as in `subprocess`
    started: bool  # it ran (or runs) on a node
    user: str = ""
    comment: str = ""

    @property
    def job_id(self) -> str:
        """The id scancel takes: ``"12_3"`` for an array task, ``"12"`` for a job."""
        job, task = self.key
        return f"{job}_{task}" if task >= 0 else str(job)

    @property
    def active(self) -> bool:
        return self.state in _PENDING or self.state in _RUNNING


def cannot_start(reason: str) -> bool:
    """Whether a PENDING job with this reason will never run as submitted."""
    return reason in _HOPELESS or bool(_PER_JOB_LIMIT.match(reason))


def decode_exit(raw: Any) -> int | None:
    """An exit code from either JSON layout: ``768`` (status word) -> 3, ``9`` -> -9."""
    if isinstance(raw, Mapping):
        signal = (raw.get("signal") or {}).get("signal_id")
        if raw.get("status") == "SIGNALED" and isinstance(signal, int):
            return -signal
        code = raw.get("return_code")
        return int(code) if isinstance(code, int) else None
    if not isinstance(raw, int):
        return None
    if raw & _SIGNAL_BIT:
        return -(raw & _SIGNAL_BIT)
    return (raw >> 8) & 0xFF


def decode_sacct_exit(text: str) -> int | None:
    """sacct's ``ExitCode`` column, ``"code:signal"`` -> code, or -signal when signalled."""
    code, _, signal = text.partition(":")
    if not code.isdigit():
        return None
    return -int(signal) if signal.isdigit() and int(signal) else int(code)


def _state(raw: Any) -> str:
    if isinstance(raw, list):
        return str(raw[0]) if raw else "UNKNOWN"
    return str(raw or "UNKNOWN")


def _number(value: Any) -> int | None:
    if isinstance(value, Mapping):  # v0.0.39+: {"set": true, "number": 12}
        return int(value["number"]) if value.get("set") else None
    return int(value) if isinstance(value, int) else None


def expand_tasks(text: str) -> list[int]:
    """``"0-3,7,9-11%4"`` -> [0, 1, 2, 3, 7, 9, 10, 11]."""
    tasks: list[int] = []
    for part in text.split("%", 1)[0].split(","):
        low, sep, high = part.partition("-")
        if low.isdigit() and (not sep or high.isdigit()):
            tasks.extend(range(int(low), int(high if sep else low) + 1))
    return tasks


def _keys(job: Mapping[str, Any]) -> list[TaskKey]:
    array = _number(job.get("array_job_id")) or 0
    if not array:
        return [(int(job["job_id"]), -1)]
    task = _number(job.get("array_task_id"))
    if task is not None:
        return [(array, task)]
    return [(array, t) for t in expand_tasks(str(job.get("array_task_string") or ""))]


def _records(job: Mapping[str, Any]) -> Iterator[JobRecord]:
    state = _state(job.get("job_state"))
    started = bool(_number(job.get("start_time"))) and state not in _PENDING
    for key in _keys(job):
        yield JobRecord(
            key=key, name=str(job.get("name") or ""), state=state,
            reason=str(job.get("state_reason") or "None"),
            exit_code=decode_exit(job.get("exit_code")), started=started,
            user=str(job.get("user_name") or ""), comment=str(job.get("comment") or ""))


def parse_squeue(document: Mapping[str, Any]) -> dict[TaskKey, JobRecord]:
    """Every job and array task in a ``squeue --json`` document, by task key."""
    found: dict[TaskKey, JobRecord] = {}
    for job in document.get("jobs") or []:
        for record in _records(job):
            found[record.key] = record
    return found


def parse_sacct(text: str) -> dict[TaskKey, JobRecord]:
    """``sacct -n -P -X -o JobID,JobName,State,Reason,ExitCode,Start`` lines, by task key."""
    found: dict[TaskKey, JobRecord] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 6:
            continue
        job_id, name, state, reason, exit_code, start = fields[:6]
        job, _, task = job_id.partition("_")
        if not job.isdigit() or (task and not task.isdigit()):
            continue  # "12_[3-5]": tasks that never left the queue
        key = (int(job), int(task) if task else -1)
        found[key] = JobRecord(
            key=key, name=name, state=state.split()[0] if state else "UNKNOWN",
            reason=reason or "None", exit_code=decode_sacct_exit(exit_code),
            started=start not in ("", "Unknown", "None"))
    return found


def worker_status(record: JobRecord, output_tail: str = "") -> WorkerStatus:
    """What a job record means for the worker it runs.

    ``output_tail`` is the end of the job's output file: slurmstepd writes "Exceeded job
    memory limit" there when it kills a job over its ``--mem`` (jobacct_gather's
    OverMemoryKill, which Slurm reports as FAILED), so such a job is named OUT_OF_MEMORY too.
    """
    state = record.state
    if state in _PENDING:
        reason = None if record.reason == "None" else record.reason
        return WorkerStatus(WorkerState.PENDING, reason=reason)
    if state in _RUNNING:
        return WorkerStatus(WorkerState.RUNNING)
    if state in ("FAILED", "CANCELLED") and _MEMORY_KILL.search(output_tail):
        state = "OUT_OF_MEMORY"
    if not record.started:
        detail = f"{state}, {record.reason}" if record.reason != "None" else state
        return WorkerStatus(WorkerState.FAILED, reason=f"never ran: {detail}")
    # COMPLETED and a plain FAILED (non-zero exit) are what the exit code says already.
    reason = None if state in ("COMPLETED", "FAILED") else state
    if state == "FAILED" and record.reason not in ("None", "NonZeroExitCode"):
        reason = f"FAILED, {record.reason}"
    return WorkerStatus(WorkerState.EXITED, exit_code=record.exit_code, reason=reason)
