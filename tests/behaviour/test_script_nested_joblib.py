"""A task the script defines calls joblib's "fiber" backend itself (a nested call): the
worker knows the backend though the script's ``import fiberexec.joblib`` never ran there
(the task travels by value, without the script's imports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
from joblib import Parallel, delayed
import fiberexec.joblib
from fiberexec import FiberExecutor


def nested(n):
    return sum(Parallel(n_jobs=2, backend="fiber")(delayed(abs)(-i) for i in range(n)))


def imports_joblib_itself(n):
    from joblib import Parallel, delayed
    return sum(Parallel(n_jobs=2, backend="fiber")(delayed(abs)(-i) for i in range(n)))


if __name__ == "__main__":
    print(Parallel(n_jobs=2, backend="fiber")(delayed(nested)(n) for n in range(5)))
    with FiberExecutor(2) as ex:
        print(list(ex.map(imports_joblib_itself, range(5), timeout=120)))
"""


def test_a_scripts_task_can_call_the_fiber_backend_in_its_worker(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT)
    assert done.stdout.splitlines() == ["[0, 0, 1, 3, 6]", "[0, 0, 1, 3, 6]"], done.stderr
