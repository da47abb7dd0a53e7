"""A task defined in the main script fails or warns: the remote traceback and the warning
name the script's file and line and show the line's source, as `ProcessPoolExecutor`'s
do (cloudpickle, which sends such a task by value, would call its file ``<dynamic-code>``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor

from fiberexec import FiberExecutor


def task(x):
    warnings.warn("look here", RuntimeWarning)
    raise ValueError(f"refusing {x}")


if __name__ == "__main__":
    Executor = FiberExecutor if sys.argv[1] == "fiberexec" else ProcessPoolExecutor
    with Executor(1) as ex:
        try:
            ex.submit(task, 7).result(timeout=120)
        except ValueError as exc:
            print(exc.__cause__)
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_a_main_script_task_shows_its_file_line_and_source(tmp_path: Path, which: str) -> None:
    done = run_script(tmp_path, SCRIPT, which)
    script = tmp_path / "script.py"
    assert f'File "{script}", line 11, in task\n    raise ValueError(f"refusing {{x}}")' in (
        done.stdout), done.stdout
    assert (f'{script}:10: RuntimeWarning: look here\n'
            f'  warnings.warn("look here", RuntimeWarning)') in done.stderr, done.stderr
    assert "<dynamic-code>" not in done.stdout + done.stderr


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_a_task_of_a_script_read_from_stdin_names_stdin(tmp_path: Path, which: str) -> None:
    """``python - < script``: no file, and the traceback says ``<stdin>`` and the line."""
    done = subprocess.run([sys.executable, "-", which], cwd=tmp_path, input=SCRIPT,
                          capture_output=True, text=True, timeout=150, check=False)
    assert done.returncode == 0, done.stderr
    assert 'File "<stdin>", line 11, in task\n' in done.stdout, done.stdout
    assert "<dynamic-code>" not in done.stdout + done.stderr
