"""A script run with interpreter options (``python -O -W error::UserWarning``): its workers
run with them too, as the stdlib's spawned and forkserver workers do (a forked one has them
anyway): asserts are skipped, warnings filtered the same. Workers started fresh and forked
from the launcher alike (four workers: the first two are fresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

from fiberexec import FiberExecutor


def flags(_):
    time.sleep(0.2)  # long enough that every worker gets a task
    try:
        warnings.warn("careful", UserWarning)
        warned = "warned"
    except UserWarning:
        warned = "raised"
    try:
        assert False
        asserted = "skipped"
    except AssertionError:
        asserted = "checked"
    return sys.flags.optimize, tuple(sys.warnoptions), warned, asserted


if __name__ == "__main__":
    Executor = FiberExecutor if sys.argv[1] == "fiberexec" else ProcessPoolExecutor
    with Executor(4) as ex:
        print(sorted(set(ex.map(flags, range(12), timeout=120))))
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_workers_run_with_the_scripts_interpreter_options(tmp_path: Path, which: str) -> None:
    done = run_script(tmp_path, SCRIPT, which, options=("-O", "-W", "error::UserWarning"))
    assert done.stdout == "[(1, ('error::UserWarning',), 'raised', 'skipped')]\n", done.stdout
