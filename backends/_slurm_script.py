"""What gets submitted: sbatch options, the array's batch script, and one file per task.

Pure builders plus `stage_batch`, which writes a batch's task files. A batch of N workers is
ONE job array (``--array=0-(N-1)``); task ``i`` sources ``<batch dir>/<i>.sh``, which exports
the worker's environment, reads and deletes its ``<i>.secret`` (mode 0600), changes to the
worker's directory and execs the worker program. The batch script Slurm stores (``scontrol
write batch_script``) and the job's recorded environment hold no secret, so ``squeue``,
``sacct`` and ``scontrol show job`` never show it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fiberexec import ConfigurationError
from fiberexec.backend import Resources, WorkerSpec

JOB_PREFIX = "fiberexec-"
COMMENT_PREFIX = "fiberexec"
_MIB = 2**20
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$")
_NAME = re.compile(r"^[A-Za-z0-9_.,:+@%-]+$")


@dataclass(frozen=True)
class SubmitOptions:
    """The cluster-side settings of every job one backend submits."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None
    constraint: str | None = None
    sbatch_options: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what in ("partition", "account", "qos"):
            value = getattr(self, what)
            if value is not None and not _NAME.match(value):
                raise ConfigurationError(
                    f"{what} must be a Slurm name (letters, digits, _.-), got {value!r}")
        if self.time_limit is not None and not _TIME.match(self.time_limit):
            raise ConfigurationError(
                f"time_limit must be in Slurm's format (minutes, MM:SS, HH:MM:SS, D-HH or "
                f"D-HH:MM:SS), got {self.time_limit!r}; e.g. time_limit='2:00:00'")
        for option in self.sbatch_options:
            if not option.startswith("-") or "\n" in option:
                raise ConfigurationError(
                    f"sbatch_options must be sbatch flags such as '--exclusive' or "
                    f"'--nice=10', one per item, got {option!r}")


def time_limit(value: str | int | float | None) -> str | None:
    """A limit in Slurm's format; a number is minutes (Slurm's unit), rounded up."""
    if value is None or isinstance(value, str):
        return value
    if value <= 0:
        raise ConfigurationError(f"time_limit must be > 0 minutes, got {value}")
    return str(math.ceil(value))


def resource_options(resources: Resources) -> list[str]:
    """``--cpus-per-task``, ``--mem`` and ``--gres`` for one worker's resources."""
    options = []
    if resources.cpu is not None:
        options.append(f"--cpus-per-task={max(1, math.ceil(resources.cpu))}")
    if resources.memory is not None:
        options.append(f"--mem={max(1, math.ceil(resources.memory / _MIB))}M")
    if resources.gpu:
        options.append(f"--gres=gpu:{resources.gpu}")
    return options


def job_name(executor_id: str) -> str:
    return f"{JOB_PREFIX}{executor_id}"


def comment(executor_id: str, batch: str) -> str:
    """The comment that marks a job as fiberexec's and names its executor and batch."""
    return f"{COMMENT_PREFIX},executor={executor_id},batch={batch}"


def sbatch_directives(opts: SubmitOptions, resources: Resources, *, name: str, note: str,
                      tasks: int, output: Path) -> list[str]:
    """Every ``#SBATCH`` option of one array of ``tasks`` workers."""
    options = [f"--job-name={name}", f"--comment={note}", f"--array=0-{tasks - 1}",
               f"--output={output}/%A_%a.out", "--open-mode=append", "--ntasks=1",
               "--nodes=1", "--no-requeue", "--export=ALL"]
    for flag, value in (("partition", opts.partition), ("account", opts.account),
                        ("qos", opts.qos), ("time", opts.time_limit),
                        ("constraint", opts.constraint)):
        if value is not None:
            options.append(f"--{flag}={value}")
    return options + resource_options(resources) + list(opts.sbatch_options)


def batch_script(directives: Sequence[str], batch_dir: Path) -> str:
    """The array's script: task ``i`` sources its own file, which execs the worker."""
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
             "# fiberexec worker array: each task runs the worker described in its task file",
             f'task_file={shlex.quote(str(batch_dir))}/"${{SLURM_ARRAY_TASK_ID:-0}}.sh"',
             '. "$task_file"',
             'echo "fiberexec: $task_file did not start the worker" >&2',
             "exit 97", ""]
    return "\n".join(lines)


def task_file(spec: WorkerSpec, command: Sequence[str], secret: Path,
              env: Mapping[str, str]) -> str:
    """One task's shell file: environment, secret (read, then deleted), directory, exec."""
    exports = {**env, **spec.env}
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(exports.items())]
    quoted = shlex.quote(str(secret))
    lines += [f"if [ -r {quoted} ]; then . {quoted}; rm -f -- {quoted}; fi",
              f"cd -- {shlex.quote(spec.workdir or os.getcwd())} || exit 98",
              f"exec {shlex.join(command)}", ""]
    return "\n".join(lines)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def stage_batch(batch_dir: Path, specs: Sequence[WorkerSpec], python: str,
                env: Mapping[str, str]) -> None:
    """Write task ``i``'s ``<i>.sh`` and ``<i>.secret`` (0600) for ``specs[i]``."""
    batch_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for index, spec in enumerate(specs):
        command = [python if part == "python" and i == 0 else part
                   for i, part in enumerate(spec.command)]
        secret = batch_dir / f"{index}.secret"
        exports = "".join(f"export {k}={shlex.quote(v)}\n"
                          for k, v in sorted(spec.secret_env.items()))
        _write_private(secret, exports)
        _write_private(batch_dir / f"{index}.sh", task_file(spec, command, secret, env))
