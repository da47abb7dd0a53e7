"""The public surface is curated, and the core never imports a concrete backend."""

from __future__ import annotations

import ast
from pathlib import Path

import fiberexec
from fiberexec.backend import available_backends

ROOT = Path(fiberexec.__file__).parent


def test_all_is_sorted_and_complete() -> None:
    assert fiberexec.__all__ == sorted(fiberexec.__all__) == sorted(fiberexec._EXPORTS)
    for name in fiberexec.__all__:
        assert getattr(fiberexec, name) is not None
    public = {n for n in dir(fiberexec) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(fiberexec.__all__)  # plus lowercase aliases such as cpu_count


def test_worker_program_does_not_load_the_executor() -> None:
    import subprocess
    import sys

    code = "import sys, fiberexec.worker; print(sorted(m for m in sys.modules if 'fiberexec' in m))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert "fiberexec._executor" not in loaded and "tenacity" not in loaded


def test_core_never_imports_a_concrete_backend() -> None:
    offenders = []
    for path in ROOT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("fiberexec.backends")]
    assert not offenders


def test_builtin_backends_are_registered_by_entry_point() -> None:
    assert {"local", "docker", "kubernetes"} <= set(available_backends())


def test_chunk_runners_do_not_load_the_executor() -> None:
    import subprocess
    import sys

    code = ("import sys, fiberexec.worker, fiberexec._chunks; "
            "print(sorted(m for m in sys.modules if 'fiberexec' in m or m == 'tenacity'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert "fiberexec._executor" not in loaded and "tenacity" not in loaded
