"""The guard that cancels a backend's jobs when the process that owns it dies.

``python -m fiberexec.backends._slurm_reaper JOB_NAME STAGING_DIR`` is started by the first
submission of a `SlurmBackend`, in its own session, with a pipe on stdin. It blocks reading
that pipe. The backend writes ``done`` before closing it after a clean `close` (which has
cancelled everything itself): the guard then just exits. End of file without ``done`` means
the owner died (even by SIGKILL, when no ``finally`` runs): the guard cancels every job of
this user with the backend's job name, still queued or running, and removes the staging
directory with the secrets of tasks that never started.
"""

from __future__ import annotations

import contextlib
import getpass
import shutil
import subprocess
import sys
from pathlib import Path

DONE = b"done"
SCANCEL_TIMEOUT = 60.0


def guard(job_name: str, staging_dir: str) -> int:
    message = sys.stdin.buffer.read()  # returns at end of file: the owner closed it or died
    if message.strip() == DONE:
        return 0
    argv = ["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"]
    try:
        subprocess.run(argv, capture_output=True, timeout=SCANCEL_TIMEOUT, check=False)
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return 0


def start_guard(job_name: str, staging: Path) -> subprocess.Popen[bytes]:
    """Start the guard for a backend's jobs; it lives until `stop_guard` or the owner's end."""
    return subprocess.Popen(
        [sys.executable, "-m", "fiberexec.backends._slurm_reaper", job_name, str(staging)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)


def stop_guard(guard: subprocess.Popen[bytes]) -> None:
    """Tell the guard all is cleaned up, and wait (bounded) for it to exit."""
    if guard.stdin is not None:
        with contextlib.suppress(OSError):
            guard.stdin.write(DONE)
            guard.stdin.close()
    try:
        guard.wait(timeout=10)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(guard(sys.argv[1], sys.argv[2]))
