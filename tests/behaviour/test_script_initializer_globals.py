"""What an initializer (or an earlier task) of the script sets in the script's globals is
there for the worker's next tasks, as in a stdlib worker: the pattern the standard
library's documentation gives for setting up each worker once. It stays the worker's when
the script then sets up its own the same way. Same script, same output, for both executors
and both pools."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(240)

SCRIPT = """
import sys

MODEL = None
CACHE = {}


def setup(name):
    global MODEL
    MODEL = name
    CACHE["setup"] = name


def predict(x):
    return MODEL, CACHE.get("setup"), x


def remember(x):
    CACHE["last"] = x


def recall(_):
    return CACHE.get("last")


if __name__ == "__main__":
    which = sys.argv[1]
    if which.endswith("pool"):
        if which == "fiberexec-pool":
            import fiberexec.multiprocessing as mp
        else:
            import multiprocessing as mp
        with mp.Pool(1, initializer=setup, initargs=("net",)) as pool:
            print(pool.map(predict, range(2)))
            pool.apply(remember, (5,))
            print(pool.apply(recall, (0,)))
            setup("the script's own")  # the script sets up its own the same way
            remember(7)
            print(pool.map(predict, range(1)), pool.apply(recall, (0,)))
    else:
        if which == "fiberexec":
            from fiberexec import FiberExecutor as Executor
        else:
            from concurrent.futures import ProcessPoolExecutor as Executor
        with Executor(1, initializer=setup, initargs=("net",)) as ex:
            print(list(ex.map(predict, range(2))))
            ex.submit(remember, 5).result()
            print(ex.submit(recall, 0).result())
            setup("the script's own")  # the script sets up its own the same way
            remember(7)
            print(list(ex.map(predict, range(1))), ex.submit(recall, 0).result())
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec", "stdlib-pool",
                                              "fiberexec-pool"))
def test_an_initializers_globals_are_there_for_the_tasks(tmp_path: Path, which: str) -> None:
    done = run_script(tmp_path, SCRIPT, which)
    assert done.stdout.splitlines() == ["[('net', 'net', 0), ('net', 'net', 1)]", "5",
                                        "[('net', 'net', 0)] 5"]
