"""Running Slurm's commands, and the one place their failures become fiberexec errors.

Every command runs with a timeout. A failure is transient when Slurm says the controller is
busy or unreachable (the job may be accepted on a later try) and permanent otherwise: an
invalid partition, account, QoS, constraint or resource request does not fix itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from fiberexec.backend import BackendError, PermanentBackendError, TransientBackendError

_TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Connection refused"
    r"|temporarily unable|Resource temporarily unavailable|Communication connection failure"
    r"|Zero Bytes were transmitted|Slurm backup controller in standby mode"
    r"|Transient|try again|EAGAIN|Connection reset|Insane message length",
    re.IGNORECASE)
_NOT_SET_UP = re.compile(
    r"Could not establish a configuration source|Unable to process configuration file"
    r"|s_p_parse_file: unable to", re.IGNORECASE)
_ALREADY_DONE = re.compile(r"already completing or completed|Invalid job id specified",
                           re.IGNORECASE)


def classify(what: str, stderr: str, returncode: int) -> BackendError:
    """The fiberexec error for a Slurm command that failed with ``stderr``."""
    detail = " ".join(line.strip() for line in stderr.strip().splitlines()[-3:]) or (
        f"exit status {returncode}")
    if _NOT_SET_UP.search(stderr):
        return PermanentBackendError(
            f"cannot {what}: Slurm is not set up on this machine ({detail}); run on a host "
            "where Slurm's commands work (a login node), or point SLURM_CONF at the "
            "cluster's slurm.conf")
    if _TRANSIENT.search(stderr):
        return TransientBackendError(
            f"cannot {what}: the Slurm controller is busy or unreachable ({detail}); "
            "check slurmctld (scontrol ping) if this persists")
    return PermanentBackendError(
        f"cannot {what}: Slurm refused ({detail}); fix the partition, account, qos, "
        "constraint, time_limit or sbatch_options given to SlurmBackend, or the worker "
        "resources (cpu, memory, gpu)")


def run(argv: Sequence[str], *, what: str, timeout: float, stdin: str | None = None,
        env: Mapping[str, str] | None = None) -> str:
    """Run one Slurm command and return its stdout.

    Raises:
        TransientBackendError: the controller is busy or unreachable, or the command timed out.
        PermanentBackendError: the command is missing, or Slurm refused the request.
    """
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False, env=env)
    except FileNotFoundError as exc:
        raise missing(argv[0], what) from exc
    except subprocess.TimeoutExpired as exc:
        raise TransientBackendError(
            f"cannot {what}: {argv[0]} did not answer within {timeout:.0f}s; the Slurm "
            "controller may be overloaded") from exc
    if done.returncode != 0:
        raise classify(what, done.stderr, done.returncode)
    return done.stdout


def missing(command: str, what: str) -> PermanentBackendError:
    """The error for a Slurm command that is not installed here."""
    return PermanentBackendError(
        f"cannot {what}: {command!r} not found; install Slurm's client commands "
        "(apt-get install slurm-client, or `module load slurm`) on this machine")


def require(command: str, *, what: str) -> None:
    """Refuse at once, before anything is staged or queued, when ``command`` is not on PATH.

    Raises:
        PermanentBackendError: as `run` would when it tries the command.
    """
    if shutil.which(command) is None:
        raise missing(command, what)


def run_json(argv: Sequence[str], *, what: str, timeout: float) -> dict[str, Any]:
    """Run a command with ``--json`` output and return the parsed document."""
    out = run(argv, what=what, timeout=timeout)
    try:
        document: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError as exc:
        raise PermanentBackendError(
            f"cannot {what}: {argv[0]} printed no JSON ({out[:200]!r}); fiberexec needs "
            "Slurm 21.08 or later with the openapi plugins (--json)") from exc
    return document


def cancel(job_ids: Sequence[str], *, timeout: float, signal: str | None = None) -> None:
    """scancel the given jobs; jobs that already ended are not an error."""
    if not job_ids:
        return
    argv = ["scancel", *([f"--signal={signal}"] if signal else []), *job_ids]
    try:
        run(argv, what=f"cancel Slurm jobs {' '.join(job_ids[:5])}", timeout=timeout)
    except PermanentBackendError as exc:
        if not _ALREADY_DONE.search(str(exc)):
            raise


def submit(argv: Sequence[str], script: str, *, what: str, timeout: float,
           env: Mapping[str, str] | None = None) -> int:
    """sbatch a script given on stdin; return the job id (``--parsable``: ``id[;cluster]``)."""
    out = run(argv, what=what, timeout=timeout, stdin=script, env=env).strip()
    head = out.split(";", 1)[0].strip()
    if not head.isdigit():
        raise PermanentBackendError(f"cannot {what}: sbatch printed {out!r}, not a job id")
    return int(head)
