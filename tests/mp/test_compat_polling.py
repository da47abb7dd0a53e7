"""A loop that polls a process, a queue or a pipe lets this process's other threads run, as
the standard library's does (its polls are system calls, which let go of the interpreter's
lock): the standard library's `Pool` loops on its workers' ``exitcode`` while results wait
for its result thread, and user code loops on ``empty()`` or ``poll()`` while a thread of
the same process takes in what it waits for.

Each test sets a switch interval far longer than its loop, so the only way in for the other
thread is a call that lets go of the lock; the loop is bounded by a count, not a time."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from tests.mp.compat import mpm  # noqa: F401  (the fixture)

LOOPS = 20_000  # calls a loop makes at most (well under a second, with any of them)


def _lets_another_thread_run(poll: Callable[[], object]) -> bool:
    """Whether a thread woken as a loop on ``poll()`` starts gets to run before the loop has
    made `LOOPS` calls."""
    go, ran = threading.Event(), threading.Event()

    def other() -> None:
        go.wait(60)
        ran.set()

    helper = threading.Thread(target=other, daemon=True)
    helper.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        go.set()
        for _ in range(LOOPS):
            poll()
            if ran.is_set():
                return True
        return False
    finally:
        sys.setswitchinterval(interval)
        helper.join(60)


@pytest.fixture
def running(mpm: ModuleType) -> Iterator[object]:  # noqa: F811
    child = mpm.Process(target=time.sleep, args=(60,))
    child.start()
    yield child
    child.kill()
    child.join(30)


@pytest.mark.parametrize("call", ["exitcode", "is_alive"])
def test_a_loop_on_a_running_process_lets_other_threads_run(running: object,
                                                            call: str) -> None:
    if call == "exitcode":
        assert _lets_another_thread_run(lambda: running.exitcode)  # type: ignore[attr-defined]
    else:
        assert _lets_another_thread_run(running.is_alive)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue", "SimpleQueue"])
def test_a_loop_on_an_empty_queue_lets_other_threads_run(mpm: ModuleType,  # noqa: F811
                                                         kind: str) -> None:
    q = getattr(mpm, kind)()
    try:
        assert _lets_another_thread_run(q.empty)
        assert q.empty()
    finally:
        q.close()


def test_a_loop_on_a_quiet_pipe_lets_other_threads_run(mpm: ModuleType) -> None:  # noqa: F811
    reader, writer = mpm.Pipe(duplex=False)
    try:
        assert _lets_another_thread_run(reader.poll)
        assert not reader.poll()
    finally:
        reader.close()
        writer.close()
