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

import getpass
import shutil
import subprocess
import sys

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


if __name__ == "__main__":
    sys.exit(guard(sys.argv[1], sys.argv[2]))
