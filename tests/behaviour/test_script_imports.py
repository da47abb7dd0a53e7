"""A script run from another directory submits functions of a module beside it: workers
import that module, as the stdlib's worker processes do (they get the parent's
``sys.path``), and see the script's ``sys.argv``. Compared with `ProcessPoolExecutor` in the
same test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

HELPER = """
import sys


def triple(x):
    return ('helper', 3 * x)


def argv():
    return sys.argv
"""

SCRIPT = """
import sys
from concurrent.futures import ProcessPoolExecutor

import helper

from fiberexec import FiberExecutor

if __name__ == "__main__":
    Executor = FiberExecutor if sys.argv[1] == "fiberexec" else ProcessPoolExecutor
    with Executor(2) as ex:
        print(list(ex.map(helper.triple, range(4))))
        print("argv is the script's:", ex.submit(helper.argv).result(timeout=120) == sys.argv)
"""


def test_workers_import_the_modules_beside_the_script_and_see_its_argv(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text(HELPER)
    (project / "script.py").write_text(SCRIPT)

    def run(which: str) -> str:
        done = subprocess.run([sys.executable, str(project / "script.py"), which],
                              cwd=tmp_path, capture_output=True, text=True, timeout=150,
                              check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run("fiberexec") == run("stdlib") == (
        "[('helper', 0), ('helper', 3), ('helper', 6), ('helper', 9)]\n"
        "argv is the script's: True\n")
