"""What a user reads when something is wrong: hints that work for a pip install, each failure
said once, and no log records on stderr unless the application asks for them."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor, PermanentBackendError
from fiberexec.backend import WorkerSpec


def test_the_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("fiberexec").handlers
    assert any(type(h) is logging.NullHandler for h in handlers)


def test_warnings_do_not_reach_stderr_through_the_last_resort_handler() -> None:
    program = ("import logging, fiberexec\n"
               "logging.getLogger('fiberexec.backends.slurm').warning('noise')\n"
               "fiberexec.enable_logging('WARNING')\n"
               "logging.getLogger('fiberexec').warning('asked for')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "noise" not in done.stderr
    assert done.stderr.rstrip().endswith("fiberexec WARNING asked for")


@pytest.fixture
def no_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH without Slurm's commands, and a staging directory to inspect."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path / "staging"


def test_missing_sbatch_is_refused_by_start_worker_before_anything_is_staged(
        no_slurm: Path) -> None:
    from fiberexec.backends.slurm import SlurmBackend

    with SlurmBackend(staging_dir=no_slurm, advertise_host="127.0.0.1") as backend, \
            pytest.raises(PermanentBackendError, match="'sbatch' not found; install Slurm"):
        backend.start_worker(WorkerSpec("w0", "slurm-test", ("python", "-V")))
    assert not no_slurm.exists()


def test_missing_sbatch_is_said_once(no_slurm: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = {"staging_dir": str(no_slurm), "advertise_host": "127.0.0.1"}
    with caplog.at_level(logging.DEBUG, logger="fiberexec"), \
            FiberExecutor(2, backend="slurm", backend_options=options) as ex:
        future = ex.submit(abs, -1)
        with pytest.raises(BrokenFiberExecutor, match="'sbatch' not found") as caught:
            future.result(timeout=60)
    assert isinstance(caught.value.__cause__, PermanentBackendError)
    said = [r for r in caplog.records
            if r.levelno >= logging.WARNING and "'sbatch' not found" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert not any("retrying" in r.getMessage() for r in caplog.records)
