"""A program that uses an executor and then forks (a stdlib ``fork`` Process, a fork
pool's workers): the child's exit leaves the parent's executor alone, as a forked child of
a program with a stdlib pool does. It neither waits on the executor's threads (which it
does not have), nor shuts its workers down, nor touches its shared-memory files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import multiprocessing
import os
import sys
import time

from fiberexec import FiberExecutor


def child():
    pass


def big(n):
    return b"x" * n


def fork_child_exits():
    p = multiprocessing.get_context("fork").Process(target=child)
    start = time.monotonic()
    p.start()
    p.join(30)
    alive = p.is_alive()
    if alive:
        p.kill()
        p.join()
    return p.exitcode == 0 and not alive and time.monotonic() - start < 10


if __name__ == "__main__":
    with FiberExecutor(2, min_workers=2) as ex:
        # shared memory both ways: this process's file (its argument) and a worker's
        assert ex.submit(len, b"x" * (4 << 20)).result(timeout=60) == 4 << 20
        assert len(ex.submit(big, 4 << 20).result(timeout=60)) == 4 << 20
        # the files the two sent through (not a worker's handshake probe: those go anyway)
        ours = f"fiberexec-{ex.executor_id}-pool-"
        before = {name for name in os.listdir("/dev/shm") if name.startswith(ours)}
        print("exits at once:", fork_child_exits())
        after = set(os.listdir("/dev/shm"))
        print("files kept:", bool(before) and before <= after)
        print("before:", sorted(before), "gone:", sorted(before - after), file=sys.stderr)
        for _ in range(3):
            assert len(ex.submit(big, 3 << 20).result(timeout=60)) == 3 << 20
        stats = ex.stats()
        print("nothing lost:", (stats.workers_lost, stats.tasks_retried) == (0, 0))
    busy = FiberExecutor(1)
    busy.submit(time.sleep, 2)
    time.sleep(0.3)
    busy.shutdown(wait=False)  # still finishing: a child must not wait for that
    print("exits at once while one shuts down:", fork_child_exits())
"""


def test_a_forked_childs_exit_leaves_the_parents_executor_alone(tmp_path: Path) -> None:
    done = run_script(tmp_path, SCRIPT)
    assert done.stdout.splitlines() == [
        "exits at once: True", "files kept: True", "nothing lost: True",
        "exits at once while one shuts down: True"], done.stderr
