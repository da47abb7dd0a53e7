"""Workers as local processes: the default backend.

Each worker is ``sys.executable -m fiberexec.worker`` in its own session (so a terminal's
Ctrl-C reaches only the program, which then shuts its workers down). Output goes to the
parent's stdout/stderr as with `multiprocessing`, or, with ``capture_output=True``, to a log
file per worker that `logs` reads back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

from fiberexec.backend import (
    Backend,
    ExitListener,
    PermanentBackendError,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)


class LocalBackend(Backend):
    """Run each worker as a child process of this one, listening on loopback only.

    Args:
        capture_output: keep each worker's output in a log file instead of passing it through.
        python: the interpreter that runs workers (default: this one).

    Example:
        >>> from fiberexec import FiberExecutor
        >>> with FiberExecutor(2, backend=LocalBackend()) as ex:  # doctest: +SKIP
        ...     ex.submit(abs, -1).result()
        1
    """

    name = "local"

    def __init__(self, *, capture_output: bool = False, python: str | None = None) -> None:
        super().__init__()
        self.capture_output = capture_output
        self.python = python or sys.executable
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._logdir: Path | None = None

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        command = list(spec.command)
        if command[:1] == ["python"]:
            command[0] = self.python
        env = {**os.environ, **spec.env, **spec.secret_env}
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                cwd=spec.workdir,
                stdin=subprocess.DEVNULL,
                stdout=self._output(spec.worker_id),
                stderr=subprocess.STDOUT if self.capture_output else None,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError as exc:
            raise PermanentBackendError(
                f"cannot start worker {spec.worker_id}: {command[0]!r} not found; "
                "pass python= to LocalBackend"
            ) from exc
        except (BlockingIOError, OSError) as exc:  # EAGAIN/ENOMEM: fork limits, may pass
            raise TransientBackendError(f"cannot start worker {spec.worker_id}: {exc}") from exc
        with self._lock:
            self._procs[spec.worker_id] = proc
        return WorkerHandle(spec.worker_id, str(proc.pid))

    def _output(self, worker_id: str) -> int | None:
        if not self.capture_output:
            return None
        if self._logdir is None:
            self._logdir = Path(tempfile.mkdtemp(prefix="fiberexec-logs-"))
        return os.open(self._logdir / f"{worker_id}.log", os.O_WRONLY | os.O_CREAT, 0o600)

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        proc = self._procs.get(handle.worker_id)
        if proc is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
        code = proc.poll()
        if code is None:
            return WorkerStatus(WorkerState.RUNNING)
        return WorkerStatus(WorkerState.EXITED, exit_code=code)

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        self.unwatch(handle)
        with self._lock:
            proc = self._procs.pop(handle.worker_id, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(timeout=10)  # reap: no zombie survives stop()

    def signal(self, handle: WorkerHandle, sig: int) -> None:
        """Send ``sig`` to the worker process (nothing if it already exited)."""
        with self._lock:
            proc = self._procs.get(handle.worker_id)
        if proc is not None:
            proc.send_signal(sig)  # a no-op once the process was reaped

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        if self._logdir is None:
            return ""
        path = self._logdir / f"{handle.worker_id}.log"
        if not path.exists():
            return ""
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=tail))

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        proc = self._procs.get(handle.worker_id)
        if proc is None:
            listener(handle, self.status(handle))
            return
        self._register(handle, listener)
        threading.Thread(
            target=self._wait_one, args=(handle, proc), name="fiberexec-local-wait", daemon=True
        ).start()

    def _wait_one(self, handle: WorkerHandle, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()  # returns when the process ends: no polling
        self._report_exit(handle, WorkerStatus(WorkerState.EXITED, exit_code=code))

    def close(self) -> None:
        with self._lock:
            workers = list(self._procs)
        for worker_id in workers:
            self.stop(WorkerHandle(worker_id, ""), grace=1.0)
        super().close()
        if self._logdir is not None:
            shutil.rmtree(self._logdir, ignore_errors=True)
