"""Objects of the standard library's `multiprocessing` given to a process, as the stdlib
gives them to a process it starts: a lock, a shared value and a pipe end work in a
fiberexec process on the same host (local backend only: they are reopened by name or file
descriptor there)."""

from __future__ import annotations

import multiprocessing
from types import ModuleType

from tests.mp import exit_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]


def test_stdlib_lock_value_and_pipe_in_a_process(mpm: ModuleType) -> None:
    std = multiprocessing.get_context("spawn")
    lock, value = std.Lock(), std.Value("i", 0, lock=False)
    here, there = std.Pipe(duplex=False)
    ps = [mpm.Process(target=t.bump, args=(lock, value, there, 500)) for _ in range(2)]
    for p in ps:
        p.start()
    for _ in ps:  # a child that cannot start must fail the test, not hang it
        assert here.poll(30), "a process did not report"
        assert here.recv() == "done"
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    assert value.value == 1000
