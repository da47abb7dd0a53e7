"""A task defined in the main script reads the script's globals as they are when it is
sent: a global bound again, or a list changed in place, between two submits (or two maps)
reaches the workers, whether or not its pickled bytes were kept between sends
(`fiberexec._byvalue`), or the worker rebuilt the function once (`fiberexec._functions`);
a map's tasks read them as the map's call found them, however late they are sent.

(The standard library differs here: its forked workers keep what the script held when they
were forked, so this is fiberexec's own contract, not a shared one.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import math
from fiberexec import FiberExecutor

SCALE = 1
WEIGHTS = [1]
TABLE = {i: i for i in range(200_000)}  # pickled long enough to travel apart


def scaled(x):
    return math.floor(x) * SCALE


def weighted(x):
    return x * sum(WEIGHTS)


def look(i):
    return TABLE[i]


def rescaling():  # the input changes a global the map's function reads
    global SCALE
    for scale in range(2, 42):
        SCALE = scale
        yield 1


if __name__ == "__main__":
    with FiberExecutor(1) as ex:
        print([ex.submit(scaled, 2).result(timeout=120) for _ in range(3)])
        SCALE = 5
        print([ex.submit(scaled, 2).result(timeout=120) for _ in range(3)])
        print(list(ex.map(scaled, [1, 2, 3], timeout=120)))
        print([ex.submit(weighted, 2).result(timeout=120) for _ in range(3)])
        WEIGHTS.append(2)
        print(ex.submit(weighted, 2).result(timeout=120))
        print(list(ex.map(look, range(1, 40), timeout=120))[:3])  # (many batches)
        TABLE[2] = -2  # read by the next map
        print(list(ex.map(look, range(1, 40), timeout=120))[:3])
    with FiberExecutor(1) as ex:  # no worker yet: the map's tasks go out after it returns
        results = ex.map(scaled, [1, 2, 3], timeout=120)
        SCALE = 7  # after the call: its tasks read what the call found
        print(list(results))
        print(len(set(ex.map(scaled, rescaling(), timeout=120, buffersize=4))))
        seen = []
        for scale in (3, 4, 3):  # a value sent before, sent again: the worker had the
            SCALE = scale  # function from those bytes already
            seen.append(ex.submit(scaled, 1).result(timeout=120))
        print(seen)
        SCALE = 1
        first = ex.map(scaled, [1] * 4, timeout=120, buffersize=1)
        SCALE = 2
        second = ex.map(scaled, [1] * 4, timeout=120, buffersize=1)
        print(list(first), list(second))
"""


def test_a_main_script_task_reads_the_globals_as_they_are_when_sent(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT)
    assert done.stdout.splitlines() == [
        "[2, 2, 2]", "[10, 10, 10]", "[5, 10, 15]", "[2, 2, 2]", "6", "[1, 2, 3]",
        "[1, -2, 3]", "[5, 10, 15]", "1", "[3, 4, 3]", "[1, 1, 1, 1] [2, 2, 2, 2]"], (
        done.stdout)


SOCKET = """
import os
import socket
import sys
from concurrent.futures import ProcessPoolExecutor

LISTENER = socket.socket()  # a global that pickles as a descriptor lent once


def uses(x):
    return x, LISTENER.fileno() >= 0


if __name__ == "__main__":
    if sys.argv[1] == "fiberexec":
        from fiberexec import FiberExecutor as Executor
    else:
        Executor = ProcessPoolExecutor
    opened = len(os.listdir("/proc/self/fd"))
    with Executor(2) as ex:
        print(list(ex.map(uses, range(4), timeout=120)))
        print(list(ex.map(uses, range(4), chunksize=2, timeout=120)))
        print(len(list(ex.map(uses, range(40), timeout=120))))
    LISTENER.close()
    print(len(os.listdir("/proc/self/fd")) - opened < 10)  # no descriptor lent and left
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_a_map_of_a_function_reading_a_socket_global_runs_on_every_worker(
        tmp_path: Path, which: str) -> None:
    """Its pickle opens once (the descriptor is lent to the first process that asks), so a
    map's one pickle of it, sent to two workers, failed on the second: such a function is
    pickled for each message, as before."""
    done = run_script(tmp_path, SOCKET, which)
    expected = "[(0, True), (1, True), (2, True), (3, True)]"
    assert done.stdout.splitlines() == [expected, expected, "40", "True"], (
        done.stdout + done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
