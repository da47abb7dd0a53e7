"""A script's function that reads a module-level lock or thread-local runs in a worker, as
under the standard library, where a forked worker inherits the object and a spawned one
makes it anew as it imports the script. fiberexec's worker gets it anew too (unlocked,
empty: `fiberexec._inherit._Anew`); one passed as an argument is still refused, as the
standard library refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

LOCK = threading.Lock()
RLOCK = threading.RLock()
LOCAL = threading.local()


def with_locks(x):
    with LOCK, RLOCK, RLOCK:
        LOCAL.seen = getattr(LOCAL, "seen", 0) + x
        return LOCAL.seen >= x


def given(lock):
    return lock.locked()


if __name__ == "__main__":
    if sys.argv[1] == "stdlib":
        ex = ProcessPoolExecutor(1)
    else:
        from fiberexec import FiberExecutor
        ex = FiberExecutor(1)
    with ex:
        print([ex.submit(with_locks, n).result(timeout=120) for n in (1, 2)])
        try:
            ex.submit(given, LOCK).result(timeout=120)
        except TypeError as exc:  # (fiberexec's PicklingError is one too)
            print("refused:", "lock" in str(exc))
"""


@pytest.mark.parametrize("system", under_test("stdlib", "fiberexec"))
def test_a_script_function_reads_a_module_level_lock_and_thread_local(
        system: str, tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT, system)
    assert done.stdout.splitlines() == ["[True, True]", "refused: True"], done.stdout
