"""``fiberexec run --backend kubernetes`` launches the program itself as a pod."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.k8s.emulator import Emulator
from tests.support.backend_kubernetes import IMAGE, NAMESPACE


def _kubeconfig(emu: Emulator, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": emu.url}}],
        "users": [{"name": "tester", "user": {}}],
        "contexts": [{"name": "emulator", "context": {
            "cluster": "emulator", "user": "tester", "namespace": NAMESPACE}}],
    }))
    return path


def test_run_launches_the_master_as_a_pod(emu: Emulator, tmp_path: Path) -> None:
    program = tmp_path / "train.py"
    program.write_text("import os\nprint('master on', os.environ['FIBEREXEC_BACKEND'])\n"
                       "raise SystemExit(3)\n")
    done = subprocess.run(
        [sys.executable, "-m", "fiberexec", "run", "--backend", "kubernetes", "--image", IMAGE,
         "--", "python", str(program)],
        env={**os.environ, "KUBECONFIG": str(_kubeconfig(emu, tmp_path / "config"))},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert "master on kubernetes" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 3  # the pod's exit code is the command's
    assert emu.pods(NAMESPACE) == []  # the master's pod is removed once it has finished
