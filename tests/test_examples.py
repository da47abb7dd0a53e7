"""Every example in examples/ runs: scripts with --small in a subprocess, manifests parsed.

Scripts are found by globbing, so an example added later is run too: every one gets
``--small`` (examples/README.md promises that each accepts it) and must exit 0 within the
timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT = 180  # seconds per example; each takes a few with --small
SCRIPTS = sorted(EXAMPLES.rglob("*.py"))
MANIFESTS = sorted([*EXAMPLES.rglob("*.yaml"), *EXAMPLES.rglob("*.yml")])

# file name -> a regular expression its output must match
EXPECTED = {
    "pi.py": r"pi ~ 3\.\d{4} \(error 0\.\d{4}\) from 20 tasks on 2 workers\n"
             r"tasks done: 20, failed: 0, workers lost: 0",
    "evolution_strategies.py": r"generation   4 .*\nreturn -?[\d.]+ -> -?[\d.]+ in 5 generations, "
                               r"40 tasks",
    "parallel_envs.py": r"4 environments x 20 steps: \d+ physics steps balanced",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBEREXEC_")}
    env["FIBEREXEC_MAX_WORKERS"] = "2"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_examples_exist() -> None:
    names = {p.name for p in SCRIPTS}
    assert set(EXPECTED) <= names
    assert EXAMPLES / "kubernetes" / "master.yaml" in MANIFESTS


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_runs(script: Path) -> None:
    result = subprocess.run([sys.executable, str(script), "--small"], cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{script.name} printed nothing"
    expected = EXPECTED.get(script.name)
    if expected is not None:
        assert re.search(expected, result.stdout), result.stdout


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    kind = doc["kind"]
    if kind == "Pod":
        return dict(doc["spec"])
    if kind in ("Job", "Deployment", "StatefulSet"):
        return dict(doc["spec"]["template"]["spec"])
    return None


def _service_account() -> str:
    yaml = pytest.importorskip("yaml")
    docs = yaml.safe_load_all((ROOT / "docs" / "kubernetes-rbac.yaml").read_text())
    (name,) = [d["metadata"]["name"] for d in docs if d and d["kind"] == "ServiceAccount"]
    return str(name)


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_manifest_has_required_fields(manifest: Path) -> None:
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert docs
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        spec = _pod_spec(doc)
        if spec is None:
            continue
        assert spec["serviceAccountName"] == _service_account()
        for container in spec["containers"]:
            assert container["image"] and container["command"]
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            assert env["FIBEREXEC_BACKEND"]["value"] == "kubernetes"
            assert env["FIBEREXEC_IMAGE"]["value"]


def test_master_job_is_not_restarted() -> None:
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((EXAMPLES / "kubernetes" / "master.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
