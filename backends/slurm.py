"""Workers as Slurm jobs: many workers start as one job array.

::

    start_worker(spec) --> Batcher (window ~50 ms) --> stage task files --> sbatch --array=0-N
         returns at once        one submission per burst    <i>.sh, <i>.secret (0600)
    monitor thread: ONE `squeue --json` per poll for all jobs --> status(), watch()
         PENDING for a reason that cannot resolve (PartitionTimeLimit, InvalidAccount, ...)
         --> scancel, FAILED with Slurm's reason
    stop: scancel <array>_<i>     close: scancel every array, wait until none is active,
    remove the staging directory   owner killed: a guard process (its own session) cancels

**Why the commands and not slurmrestd.** ``sbatch``, ``squeue``, ``scancel`` and ``sacct`` are
on every login and compute node of every Slurm site, authenticate through munge with no
token to manage, and are what users already run; slurmrestd is optional, often not deployed,
and needs JWT setup. The commands' output: ``sbatch --parsable`` prints the job id;
``squeue --json`` is the only squeue output of Slurm 22.05 (Debian 12's) that carries a job's
exit code and state reason, so status comes from it. 22.05 ignores squeue's filters with
``--json``, so one call returns every job and we pick ours; `_slurm_jobs` parses both the
22.05 layout and the later one. Jobs gone from squeue (older than the cluster's MinJobAge)
are looked up with ``sacct -P`` (parsable: sacct's JSON needs slurmdbd and changed layout
between releases); without accounting they are reported UNKNOWN.

**The secret.** It is never an argument, an ``#SBATCH`` line or part of the exported
environment: each task's secret sits in a 0600 file in the staging directory (which must be
on a filesystem the compute nodes share, as home directories are on most clusters), read and
deleted by the task's shell before it execs the worker. So ``squeue``, ``sacct``,
``scontrol show job`` and ``scontrol write batch_script`` never show it.

**Exit codes.** A worker killed by signal N reports ``-N``; the state (TIMEOUT, CANCELLED,
OUT_OF_MEMORY, NODE_FAIL, PREEMPTED) is the reason. A job killed for exceeding ``--mem`` by
jobacct_gather's OverMemoryKill (clusters without cgroup enforcement) is reported FAILED by
Slurm; the backend names it OUT_OF_MEMORY from slurmstepd's message in the job's output.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fiberexec.backend import (
    Backend,
    BackendError,
    ConfigurationError,
    ExitListener,
    ExitWatch,
    MasterRequest,
    PermanentBackendError,
    Probe,
    RetryPolicy,
    Sweep,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)
from fiberexec.backends import _slurm_cli as cli
from fiberexec.backends import _slurm_script as script
from fiberexec.backends._slurm_batch import Batcher
from fiberexec.backends._slurm_jobs import (
    JobRecord,
    TaskKey,
    cannot_start,
    parse_sacct,
    parse_squeue,
    worker_status,
)
from fiberexec.backends._slurm_master import run_master
from fiberexec.backends._slurm_reaper import start_guard, stop_guard
from fiberexec.backends._slurm_stray import DEFAULT_STAGING, find_worker_jobs, remove_stray

__all__ = ["SlurmBackend", "remove_stray", "run_master"]

log = logging.getLogger("fiberexec.backends.slurm")
_TAIL_BYTES = 64 * 1024
_SACCT_FIELDS = "JobID,JobName,State,Reason,ExitCode,Start"


@dataclass(eq=False)
class _Worker:
    handle: WorkerHandle
    spec: WorkerSpec
    key: TaskKey | None = None  # (array job id, task index) once submitted
    batch_dir: Path | None = None
    failure: WorkerStatus | None = None  # never submitted, or can never start
    submitted_at: float = 0.0


class SlurmBackend(Backend):
    """Run each worker as a task of a Slurm job array.

    Args:
        partition, account, qos, constraint: ``--partition``, ``--account``, ``--qos``,
            ``--constraint`` of every job.
        time_limit: ``--time``: Slurm's format (``"2:00:00"``, ``"1-0"``) or minutes.
        sbatch_options: more sbatch flags, one per item (``["--exclusive", "--nice=10"]``),
            written as ``#SBATCH`` lines after the ones built from the spec.
        env: extra environment variables exported in every task (besides the submitting
            process's environment, which sbatch passes on with ``--export=ALL``).
        python: the interpreter on the compute nodes that runs ``-m fiberexec.worker``
            (default: this one, which suits a shared filesystem or identical images).
        staging_dir: where task files, secrets and job output live; it must be shared with
            the compute nodes (default ``~/.fiberexec/slurm``).
        advertise_host: the address workers dial (default: this host's name). When it
            resolves to a loopback address the executor binds that address only, else all.
        batch_window: seconds to collect worker requests into one array after the first.
        max_array: most tasks per array (keep it under the cluster's MaxArraySize).
        poll_interval: seconds between squeue calls while jobs are active.
        command_timeout: seconds any one Slurm command may take.
        close_timeout: seconds `close` waits for cancelled jobs to leave the queue.
        retry: policy for submissions that fail transiently (controller busy).

    Resources map to ``--cpus-per-task`` (rounded up), ``--mem`` and ``--gres=gpu:N``.

    Example:
        >>> from fiberexec import FiberExecutor
        >>> backend = SlurmBackend(partition="cpu", time_limit="4:00:00")  # doctest: +SKIP
        >>> with FiberExecutor(64, backend=backend, cpu=1, memory="2G") as ex:  # doctest: +SKIP
        ...     print(sum(ex.map(abs, range(-100, 0))))
        5050
    """

    name = "slurm"
    enforces_resources = True
    resource_limits: ClassVar[Mapping[str, str]] = {
        "cpu": "--cpus-per-task, rounded up",
        "memory": "--mem",
        "gpu": "--gres=gpu:N",
    }
    shares_python = True  # the python= default: a shared filesystem or identical nodes

    def __init__(self, *, partition: str | None = None, account: str | None = None,
                 qos: str | None = None, time_limit: str | int | float | None = None,
                 constraint: str | None = None, sbatch_options: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, python: str | None = None,
                 staging_dir: str | os.PathLike[str] | None = None,
                 advertise_host: str | None = None, batch_window: float = 0.05,
                 max_array: int = 1000, poll_interval: float = 1.0,
                 command_timeout: float = 30.0, close_timeout: float = 60.0,
                 retry: RetryPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(sbatch_options, str):
            raise ConfigurationError(
                f"sbatch_options must be a list of flags, got the string {sbatch_options!r}; "
                f"pass [{sbatch_options!r}]")
        _check_positive(batch_window=batch_window, poll_interval=poll_interval,
                        command_timeout=command_timeout, close_timeout=close_timeout)
        if max_array < 1:
            raise ConfigurationError(f"max_array must be >= 1, got {max_array}")
        self.options = script.SubmitOptions(
            partition=partition, account=account, qos=qos,
            time_limit=script.time_limit(time_limit), constraint=constraint,
            sbatch_options=tuple(sbatch_options), env=dict(env or {}))
        self.python = python or sys.executable
        self.staging_root = Path(staging_dir or DEFAULT_STAGING).expanduser()
        self.advertise_host, self.bind_host = _hosts(advertise_host)
        self.poll_interval = poll_interval
        self.command_timeout = command_timeout
        self.close_timeout = close_timeout
        self._retry = retry or RetryPolicy(attempts=6, deadline=60.0)
        self._clock = clock
        self._lock = threading.RLock()
        self._workers: dict[str, _Worker] = {}
        self._arrays: set[int] = set()  # every array job submitted, for close()
        self._records: dict[TaskKey, JobRecord] = {}
        self._refreshed = -float("inf")  # when the last squeue snapshot was taken
        self._refresh_lock = threading.Lock()
        self._executor_id: str | None = None
        self._staging: Path | None = None
        self._guard: subprocess.Popen[bytes] | None = None
        self._refused: PermanentBackendError | None = None
        self._closed = threading.Event()
        self._exit_watch = ExitWatch()
        self._monitor: threading.Thread | None = None
        self._batcher: Batcher[_Worker] = Batcher(
            self._submit, window=batch_window, limit=max_array, name="fiberexec-slurm-submit",
            clock=clock)

    # -- the seam --------------------------------------------------------------------------
    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        """Queue the worker for the next array submission and return its handle at once.

        Raises:
            PermanentBackendError: ``sbatch`` is not installed here, or an earlier submission
                was refused for good (bad partition, account, resources...), so this one
                would be too. Either is raised here, to the caller, and logged by nobody.
        """
        with self._lock:
            if self._closed.is_set():
                raise PermanentBackendError("start_worker after close(); create a new backend")
            if self._refused is not None:
                raise self._refused
            if self._executor_id is None:  # the first worker: say now that none can start
                cli.require("sbatch", what="submit fiberexec workers as a Slurm job array")
            self._bind_executor(spec.executor_id)
            handle = WorkerHandle(spec.worker_id, f"{script.job_name(spec.executor_id)}/"
                                                  f"{spec.worker_id}")
            worker = _Worker(handle, spec)
            self._workers[spec.worker_id] = worker
        self._batcher.add(worker)
        return handle

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        with self._lock:
            worker = self._workers.get(handle.worker_id)
        if worker is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
        return self._status(worker, refresh=True)

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        """Report ``handle``'s end from the one monitor thread (one squeue per poll)."""
        self._exit_watch.watch(handle, listener)
        self._ensure_monitor()
        with self._lock:
            worker = self._workers.get(handle.worker_id)
        if worker is None or worker.failure is not None:
            self._exit_watch.report(handle, self.status(handle))

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        """scancel the worker's task (Slurm's KillWait, not ``grace``, spaces TERM and KILL)."""
        self.unwatch(handle)
        with self._lock:
            worker = self._workers.pop(handle.worker_id, None)
        if worker is None or self._batcher.discard(worker):
            return
        if worker.key is not None:
            cli.cancel([_job_id(worker.key)], timeout=self.command_timeout)
            if worker.batch_dir is not None:  # a task that never started keeps its secret
                with contextlib.suppress(OSError):
                    (worker.batch_dir / f"{worker.key[1]}.secret").unlink()

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        with self._lock:
            worker = self._workers.get(handle.worker_id)
        if worker is None or worker.key is None or worker.batch_dir is None or tail <= 0:
            return ""
        return "".join(deque(_tail(_output(worker)).splitlines(keepends=True), maxlen=tail))

    # -- capabilities of the ``fiberexec`` command ---------------------------------------------

    @classmethod
    def launch_master(cls, request: MasterRequest) -> int:
        """Submit the program as a batch job, stream its output; its exit status."""
        return run_master(request.command, request.master_env(os.environ), keep=request.keep)

    @classmethod
    def probe(cls) -> Probe:
        try:
            text = cli.run(["sinfo", "--noheader", "--format=%P %a %D %t"],
                           what="ask Slurm for its partitions", timeout=10)
        except (BackendError, OSError) as exc:
            return Probe(cls.name, False, str(exc).splitlines()[0])
        return Probe(cls.name, True, "; ".join(text.split("\n")[:3]).strip() or "no partitions")

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """Cancel this user's fiberexec worker jobs ``sweep`` picks: one executor's, or all.

        Slurm holds no lease an executor renews, so a bare sweep cannot tell a live
        executor's jobs from a dead one's: it cancels nothing and says so.
        """
        if sweep.executor_id is None and not sweep.everything:
            return ["cannot tell live executors' jobs from gone ones' on Slurm; nothing "
                    "removed (name one with --executor ID, or pass --all)"]
        if sweep.dry_run:
            return [f"would cancel job {r.key[0]} ({r.name})"
                    for r in find_worker_jobs(sweep.executor_id)] or ["no worker jobs"]
        return [f"cancelled {remove_stray(sweep.executor_id)} worker job(s)"]

    def close(self) -> None:
        """Cancel every job this backend submitted, wait until they left, remove its files."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._batcher.close(timeout=self.command_timeout * 2)
        self._exit_watch.clear()  # every job is cancelled below: none is reported
        with self._lock:
            arrays = sorted(self._arrays)
            self._workers.clear()
        try:
            cli.cancel([str(a) for a in arrays], timeout=self.command_timeout)
            self._wait_gone(set(arrays))
        finally:
            if self._monitor is not None:
                self._monitor.join(timeout=self.command_timeout)
            if self._guard is not None:
                stop_guard(self._guard)
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)

    # -- submitting ------------------------------------------------------------------------
    def _bind_executor(self, executor_id: str) -> None:
        """Remember the one executor this backend serves; start the guard (under ``_lock``)."""
        if self._executor_id is None:
            self._executor_id = executor_id
            self._staging = self.staging_root / f"{executor_id}-{secrets.token_hex(3)}"
            self._staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._guard = start_guard(script.job_name(executor_id), self._staging)
        elif executor_id != self._executor_id:
            raise ConfigurationError(
                f"one SlurmBackend serves one executor, got executor id {executor_id!r} "
                f"after {self._executor_id!r}; create a backend per executor")

    def _submit(self, workers: list[_Worker]) -> None:
        """Submit one batch: one array per distinct resource request (usually one)."""
        groups: dict[object, list[_Worker]] = {}
        for worker in workers:
            groups.setdefault(worker.spec.resources, []).append(worker)
        for group in groups.values():
            self._submit_array(group)

    def _submit_array(self, workers: list[_Worker]) -> None:
        assert self._staging is not None and self._executor_id is not None
        batch = secrets.token_hex(4)
        batch_dir = self._staging / batch
        note = script.comment(self._executor_id, batch)
        directives = script.sbatch_directives(
            self.options, workers[0].spec.resources, name=script.job_name(self._executor_id),
            note=note, tasks=len(workers), output=batch_dir)
        try:
            script.stage_batch(batch_dir, [w.spec for w in workers], self.python,
                               self.options.env)
            text = script.batch_script(directives, batch_dir)
            job = self._retry.call(lambda: self._sbatch(text, note, len(workers)))
        except (BackendError, OSError) as exc:
            self._submission_failed(workers, batch_dir, exc)
            return
        self._submitted(workers, job, batch_dir)

    def _sbatch(self, text: str, note: str, tasks: int) -> int:
        what = f"submit a job array of {tasks} fiberexec worker(s)"
        try:
            return cli.submit(["sbatch", "--parsable"], text, what=what,
                              timeout=self.command_timeout)
        except TransientBackendError:
            found = self._find_by_comment(note)  # a timed-out sbatch may have got through
            if found is not None:
                return found
            raise

    def _find_by_comment(self, note: str) -> int | None:
        with contextlib.suppress(BackendError):
            for record in self._query().values():
                if record.comment == note:
                    return record.key[0]
        return None

    def _submitted(self, workers: list[_Worker], job: int, batch_dir: Path) -> None:
        log.info("submitted job array %d (%d worker(s): %s)", job, len(workers),
                 ", ".join(w.spec.worker_id for w in workers[:8]))
        stale = []
        with self._lock:
            self._arrays.add(job)
            now = self._clock()
            for index, worker in enumerate(workers):
                worker.key, worker.batch_dir, worker.submitted_at = (job, index), batch_dir, now
                if self._workers.get(worker.spec.worker_id) is not worker:
                    stale.append(_job_id(worker.key))  # stopped while being submitted
            self._refreshed = -float("inf")
        if stale:
            with contextlib.suppress(BackendError):
                cli.cancel(stale, timeout=self.command_timeout)

    def _submission_failed(self, workers: list[_Worker], batch_dir: Path,
                           exc: BaseException) -> None:
        # Not a warning: each worker's status carries the reason to the executor, which
        # reports it, and a permanent refusal is raised by the next start_worker.
        log.debug("submission of %d worker(s) failed: %s", len(workers), exc)
        shutil.rmtree(batch_dir, ignore_errors=True)
        status = WorkerStatus(WorkerState.FAILED, reason=str(exc))
        with self._lock:
            if isinstance(exc, PermanentBackendError):
                self._refused = exc
            for worker in workers:
                worker.failure = status
        for worker in workers:
            self._exit_watch.report(worker.handle, status)

    # -- watching --------------------------------------------------------------------------
    def _ensure_monitor(self) -> None:
        with self._lock:
            if self._monitor is None and not self._closed.is_set():
                self._monitor = threading.Thread(target=self._monitor_loop,
                                                 name="fiberexec-slurm-monitor", daemon=True)
                self._monitor.start()

    def _monitor_loop(self) -> None:
        while not self._closed.wait(self.poll_interval):
            keys = self._exit_watch.keys()
            with self._lock:
                workers = [self._workers[k] for k in keys if k in self._workers]
            if not workers:
                continue
            try:
                self._refresh()
            except BackendError as exc:
                log.warning("fiberexec slurm: cannot read the queue: %s", exc)
                continue
            for worker in workers:
                status = self._status(worker, refresh=False)
                if status.finished:
                    self._exit_watch.report(worker.handle, status)

    def _query(self) -> dict[TaskKey, JobRecord]:
        document = cli.run_json(["squeue", "--json"], what="list Slurm jobs",
                                timeout=self.command_timeout)
        return parse_squeue(document)

    def _refresh(self) -> None:
        """Read the queue once for everyone (calls that arrive meanwhile reuse the result)."""
        with self._refresh_lock:
            if self._clock() - self._refreshed < self.poll_interval / 2:
                return
            taken = self._clock()
            records = self._query()
            with self._lock:
                self._records = {k: r for k, r in records.items() if k[0] in self._arrays}
                self._refreshed = taken

    def _status(self, worker: _Worker, *, refresh: bool) -> WorkerStatus:
        if worker.failure is not None:
            return worker.failure
        if worker.key is None:
            return WorkerStatus(WorkerState.PENDING, reason="waiting for its array to be "
                                                            "submitted")
        if refresh:
            self._refresh()
        with self._lock:
            record = self._records.get(worker.key)
            unseen = worker.submitted_at >= self._refreshed  # submitted after the snapshot
        if record is None and unseen:
            return WorkerStatus(WorkerState.PENDING, reason="submitted")
        if record is None:
            record = self._accounting(worker.key)
        if record is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason=f"Slurm no longer knows job "
                                                            f"{_job_id(worker.key)}")
        if record.state == "PENDING" and cannot_start(record.reason):
            return self._hopeless(worker, record)
        tail = _tail(_output(worker), 4096) if record.state in ("FAILED", "CANCELLED") else ""
        return worker_status(record, tail)

    def _hopeless(self, worker: _Worker, record: JobRecord) -> WorkerStatus:
        assert worker.key is not None
        with contextlib.suppress(BackendError):
            cli.cancel([_job_id(worker.key)], timeout=self.command_timeout)
        status = WorkerStatus(WorkerState.FAILED, reason=(
            f"Slurm job {_job_id(worker.key)} is PENDING ({record.reason}) and cannot start "
            "as submitted; fix the partition, account, qos, time_limit, constraint or "
            "resources given to the Slurm backend"))
        worker.failure = status
        return status

    def _accounting(self, key: TaskKey) -> JobRecord | None:
        """The job's final record from sacct, when the cluster keeps accounting."""
        try:
            out = cli.run(["sacct", "-n", "-P", "-X", "-o", _SACCT_FIELDS, "-j", _job_id(key)],
                          what="read Slurm accounting", timeout=self.command_timeout)
        except BackendError:
            return None
        return parse_sacct(out).get(key)

    def _wait_gone(self, arrays: set[int]) -> None:
        """Wait (bounded, one squeue per poll) until no task of ``arrays`` is active."""
        deadline = self._clock() + self.close_timeout
        while arrays:
            try:
                active = [r.job_id for k, r in self._query().items()
                          if k[0] in arrays and r.active]
            except BackendError as exc:
                log.warning("fiberexec slurm: cannot confirm jobs ended: %s", exc)
                return
            if not active:
                return
            if self._clock() >= deadline:
                log.warning("Slurm jobs %s still active %.0fs after scancel; run "
                            "fiberexec cleanup --backend slurm", active[:10], self.close_timeout)
                return
            threading.Event().wait(min(0.2, self.poll_interval))


# -- helpers ---------------------------------------------------------------------------------
def _job_id(key: TaskKey) -> str:
    return f"{key[0]}_{key[1]}" if key[1] >= 0 else str(key[0])


def _output(worker: _Worker) -> Path:
    assert worker.key is not None and worker.batch_dir is not None
    return worker.batch_dir / f"{worker.key[0]}_{worker.key[1]}.out"


def _tail(path: Path, size: int = _TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _hosts(advertise: str | None) -> tuple[str, str]:
    """(advertise, bind): bind the advertised address itself when it is a loopback one."""
    advertise = advertise or socket.gethostname()
    try:
        address = socket.gethostbyname(advertise)
    except OSError as exc:
        raise ConfigurationError(
            f"advertise_host {advertise!r} does not resolve ({exc}); pass the address "
            "compute nodes reach this machine at, e.g. advertise_host='10.0.0.5'") from exc
    return advertise, address if ipaddress.ip_address(address).is_loopback else "0.0.0.0"


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ConfigurationError(f"{name} must be > 0 seconds, got {value}")
