"""The one-line-change gallery: the same program, both libraries, the same trajectories."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(library: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ppo_rollout.py"), "--mp",
                           library, "--envs", "3", "--steps", "30", "--step-cost", "0"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 0, done.stderr
    match = re.search(r"trajectory ([0-9a-f]{16})", done.stdout)
    assert match, done.stdout
    return match.group(1)


def test_ppo_rollout_gives_the_stdlibs_trajectories() -> None:
    assert _run("fiberexec") == _run("stdlib")
