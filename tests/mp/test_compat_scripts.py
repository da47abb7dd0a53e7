"""A script run from another directory, as users run them: the modules beside it and its
own functions and classes reach its children, as with the stdlib's spawn start method.

The script hands this module's context to `concurrent.futures.ProcessPoolExecutor` and to
the stdlib's `JoinableQueue`, which pickle with the stdlib's pickler: the script's function
and class travel by reference (``__main__.double``), so a child finds them by importing
the script as ``__mp_main__``, on first need. Each run is compared with the stdlib's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import BACKEND

pytestmark = pytest.mark.timeout(240)

HELPER = '''
import sys


def put_argv(q):
    q.put(sys.argv[1:])


def describe(point):
    return f"{type(point).__module__}.{type(point).__qualname__} {point!r}"


def fail():
    raise ValueError("raised in a worker")
'''

SCRIPT = '''
import concurrent.futures
import multiprocessing.queues
import sys

import helper  # beside this script, which is not where it runs from

if sys.argv[1] == "stdlib":
    import multiprocessing as mp
else:
    import fiberexec.multiprocessing as mp


def double(x):
    return 2 * x


class Point:
    def __init__(self, x):
        self.x = x

    def __repr__(self):
        return f"Point({self.x})"


def consume(q):
    while (item := q.get()) is not None:
        q.task_done()
    q.task_done()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=helper.put_argv, args=(q,))
    p.start()
    print("child argv is ours:", q.get(timeout=60) == sys.argv[1:])
    p.join(60)
    print("exit", p.exitcode)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        print(list(ex.map(double, range(6))))
        print(ex.submit(helper.describe, Point(3)).result(timeout=60))
        try:
            ex.submit(helper.fail).result(timeout=60)
        except ValueError as exc:
            print("raised:", exc)
    jq = multiprocessing.queues.JoinableQueue(ctx=ctx)
    c = ctx.Process(target=consume, args=(jq,))
    c.start()
    for i in range(3):
        jq.put(i)
    jq.put(None)
    jq.join()
    c.join(60)
    print("joined", c.exitcode)
'''


def test_a_script_run_from_elsewhere_behaves_as_with_the_stdlib(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text(textwrap.dedent(HELPER))
    script = project / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(module: str) -> str:
        done = subprocess.run([sys.executable, str(script), module], cwd=elsewhere,
                              capture_output=True, text=True, timeout=200, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ours = run("fiberexec")
    assert ours == run("stdlib")
    assert ours.splitlines() == [
        "child argv is ours: True",
        "exit 0",
        "[0, 2, 4, 6, 8, 10]",
        "__mp_main__.Point Point(3)",
        "raised: raised in a worker",
        "joined 0",
    ]


PRINTING = '''
import sys

if sys.argv[1] == "stdlib":
    import multiprocessing as mp
else:
    import fiberexec.multiprocessing as mp


def speak(code):
    print("out one")
    print("err one", file=sys.stderr)
    print("out two", flush=True)
    print("out three")
    sys.exit(code)


if __name__ == "__main__":
    for code in (0, 3):
        p = mp.Process(target=speak, args=(code,))
        p.start()
        p.join(60)
        print("exit", p.exitcode, flush=True)
'''


@pytest.mark.parametrize("module", ["stdlib", "fiberexec"] if BACKEND == "local"
                         else ["fiberexec"])  # (the stdlib's run is the same everywhere)
def test_what_a_child_prints_reaches_the_parents_output(module: str, tmp_path: Path) -> None:
    """On every backend: a child in a container, a pod, a job or on another host sends its
    lines to its parent, which writes them as a stdlib child's reach the shared terminal,
    before the child is reported ended."""
    script = tmp_path / "printing.py"
    script.write_text(PRINTING)
    done = subprocess.run([sys.executable, str(script), module], cwd=tmp_path,
                          capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["out one", "out two", "out three", "exit 0",
                                        "out one", "out two", "out three", "exit 3"]
    assert done.stderr.count("err one\n") == 2, done.stderr
