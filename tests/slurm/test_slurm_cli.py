"""``fiberexec run --backend slurm``: the master as a batch job, its output streamed back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.backend_slurm import active_fiberexec_jobs

ROOT = Path(__file__).resolve().parents[2]

TRAIN = textwrap.dedent("""
    import os, sys
    from fiberexec import FiberExecutor
    from tests import tasks

    print("master in job", os.environ["SLURM_JOB_ID"], flush=True)
    with FiberExecutor(2) as ex:  # the backend comes from FIBEREXEC_BACKEND=slurm
        print("squares", sum(ex.map(tasks.square, range(10))), flush=True)
    print("backend", os.environ["FIBEREXEC_BACKEND"])
    sys.exit(3)
""")


def test_run_submits_the_master_and_streams_its_output(tmp_path: Path) -> None:
    program = tmp_path / "train.py"
    program.write_text(TRAIN)
    options = json.dumps({"advertise_host": "127.0.0.1", "poll_interval": 0.25,
                          "staging_dir": str(tmp_path / "staging")})
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-m", "fiberexec", "run", "--backend", "slurm",
         "--env", f"FIBEREXEC_BACKEND_OPTIONS={options}", "--", "python", str(program)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert "fiberexec: submitted master job" in done.stderr, done.stderr
    assert "master in job" in done.stdout, (done.stdout, done.stderr)
    assert "squares 285" in done.stdout, (done.stdout, done.stderr)
    assert "backend slurm" in done.stdout
    assert done.returncode == 3, "the program's exit status is the command's"
    assert not active_fiberexec_jobs(), "master and worker jobs must all have ended"
    assert not list((tmp_path / "staging").glob("*")), "the workers' staging dir is removed"
