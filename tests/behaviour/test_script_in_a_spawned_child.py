"""An executor used in a child the stdlib's ``spawn`` started, where the script is
``__mp_main__``: its functions run on the workers, which cannot import it by that name
(they travel by value, as a script's ``__main__`` ones do)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from fiberexec import FiberExecutor

SCALE = 10


class Point:
    def __init__(self, x):
        self.x = x


def inner(point):
    return point.x * SCALE


def outer(n):
    with FiberExecutor(1) as ex:
        return [ex.submit(inner, Point(i)).result(timeout=60) for i in range(n)]


if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        print(pool.submit(outer, 3).result(timeout=120))
"""


def test_a_spawned_childs_executor_runs_the_scripts_functions(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT)
    assert done.stdout.splitlines() == ["[0, 10, 20]"], done.stderr
