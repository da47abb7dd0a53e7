"""``fiberexec run --backend slurm``: the program as a batch job, its output streamed back.

The program runs under ``sbatch`` (``--export=ALL`` with the master's ``FIBEREXEC_*``
variables added), so its own `FiberExecutor` submits worker arrays from the job's node. Its
output file is followed until the job leaves the queue; the exit status is the job's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from fiberexec.backend import BackendError
from fiberexec.backends import _slurm_cli as cli
from fiberexec.backends import _slurm_script as script
from fiberexec.backends._slurm_jobs import JobRecord, parse_squeue

MASTER_NAME = "fiberexec-master"


def master_script(command: Sequence[str], cwd: str, output: Path,
                  opts: script.SubmitOptions) -> str:
    directives = [f"--job-name={MASTER_NAME}", f"--comment={script.COMMENT_PREFIX},master",
                  f"--output={output}", "--open-mode=append", "--ntasks=1", "--nodes=1",
                  "--no-requeue", "--export=ALL"]
    for flag, value in (("partition", opts.partition), ("account", opts.account),
                        ("qos", opts.qos), ("time", opts.time_limit),
                        ("constraint", opts.constraint)):
        if value is not None:
            directives.append(f"--{flag}={value}")
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in [*directives, *opts.sbatch_options]),
             f"cd -- {shlex.quote(cwd)} || exit 98", f"exec {shlex.join(command)}", ""]
    return "\n".join(lines)


def run_master(command: Sequence[str], env: Mapping[str, str], *,
               options: script.SubmitOptions | None = None,
               staging_dir: str | os.PathLike[str] | None = None, poll_interval: float = 0.5,
               command_timeout: float = 30.0, keep: bool = False,
               out: BinaryIO | None = None) -> int:
    """Submit ``command`` as a batch job, copy its output to ``out``, return its exit status.

    Ctrl-C cancels the job. The exit status is the program's, or 128 + N when a signal
    ended it (a time limit, scancel), as a shell reports it. sbatch's own input variables
    (``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_TIMELIMIT``...) set the master
    job's partition, account and limits.
    """
    out = out or sys.stdout.buffer
    root = Path(staging_dir or "~/.fiberexec/slurm").expanduser()
    folder = root / f"master-{secrets.token_hex(4)}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    output = folder / "output.log"
    text = master_script(command, os.getcwd(), output, options or script.SubmitOptions())
    try:
        job = cli.submit(["sbatch", "--parsable"], text, what="submit the master job",
                         timeout=command_timeout, env={**os.environ, **env})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    print(f"fiberexec: submitted master job {job} (output {output})", file=sys.stderr)
    try:
        record = _follow(job, output, out, poll_interval, command_timeout)
        return _exit_status(record)
    except KeyboardInterrupt:
        with contextlib.suppress(BackendError):
            cli.cancel([str(job)], timeout=command_timeout)
        return 130
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _follow(job: int, output: Path, out: BinaryIO, poll: float,
            timeout: float) -> JobRecord | None:
    """Copy new output until the job has left the active states; return its last record."""
    offset, wake = 0, threading.Event()
    while True:
        document = cli.run_json(["squeue", "--json"], what="follow the master job",
                                timeout=timeout)
        record = parse_squeue(document).get((job, -1))
        offset = _copy(output, offset, out)
        if record is None or not record.active:
            _copy(output, offset, out)
            return record
        wake.wait(poll)


def _copy(path: Path, offset: int, out: BinaryIO) -> int:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        out.write(data)
        out.flush()
    return offset + len(data)


def _exit_status(record: JobRecord | None) -> int:
    if record is None:
        print("fiberexec: the master job left the queue unseen; its exit code is unknown",
              file=sys.stderr)
        return 1
    code = record.exit_code if record.exit_code is not None else 1
    if record.state not in ("COMPLETED", "FAILED"):
        print(f"fiberexec: master job {record.job_id} ended {record.state}", file=sys.stderr)
    return 128 - code if code < 0 else code
