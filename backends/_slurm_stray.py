"""Finding and cancelling fiberexec worker jobs whose executor is gone (``fiberexec cleanup``)."""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

from fiberexec.backends import _slurm_cli as cli
from fiberexec.backends import _slurm_script as script
from fiberexec.backends._slurm_jobs import JobRecord, parse_squeue

DEFAULT_STAGING = Path("~/.fiberexec/slurm")
_WORKER_COMMENT = f"{script.COMMENT_PREFIX},executor="


def is_worker_job(record: JobRecord, executor_id: str | None) -> bool:
    """A worker job by its comment and name (of ``executor_id``, if given); never a master."""
    if not record.comment.startswith(_WORKER_COMMENT):
        return False
    if executor_id is None:
        return record.name.startswith(script.JOB_PREFIX)
    return record.name == script.job_name(executor_id)


def find_worker_jobs(executor_id: str | None = None,
                     command_timeout: float = 30.0) -> list[JobRecord]:
    """This user's queued or running worker jobs (of ``executor_id``, if given)."""
    document = cli.run_json(["squeue", "--json"], what="list Slurm jobs",
                            timeout=command_timeout)
    user = getpass.getuser()
    return [r for r in parse_squeue(document).values()
            if r.active and r.user in ("", user) and is_worker_job(r, executor_id)]


def remove_stray(executor_id: str | None = None, staging_dir: str | None = None,
                 command_timeout: float = 30.0) -> int:
    """Cancel this user's queued or running fiberexec worker jobs (of one executor, if given).

    Jobs are recognised by their comment (``fiberexec,executor=<id>,batch=<id>``) and name
    (``fiberexec-<executor id>``); master jobs of ``fiberexec run`` are left alone. The
    staging directories of the executors they belonged to are removed too. Like the other
    backends' ``remove_stray``, it holds no lease to tell a live executor's jobs from a dead
    one's: `SlurmBackend.remove_stray` asks for an executor id or ``everything``.

    Returns:
        how many jobs (array tasks count one each) were cancelled.
    """
    found = find_worker_jobs(executor_id, command_timeout)
    cli.cancel(sorted({str(r.key[0]) for r in found}), timeout=command_timeout)
    root = Path(staging_dir or DEFAULT_STAGING).expanduser()
    for executor in {r.name.removeprefix(script.JOB_PREFIX) for r in found}:
        for path in root.glob(f"{executor}-*"):
            shutil.rmtree(path, ignore_errors=True)
    return len(found)
