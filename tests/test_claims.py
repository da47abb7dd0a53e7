"""A task that will not let go of the interpreter lock, and the tasks its worker holds.

A worker on the executor's host shares a claim board with it (`fiberexec._claims`), so the
tasks sent to wait behind its running one come back to the queue without the worker's
answer: none waits for a task that holds the GIL in C while another worker idles, and none
runs twice. And such a worker, silent meanwhile, is not taken for dead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pytest

from fiberexec import FiberExecutor, _shm
from fiberexec._claims import BITS, ClaimBoard
from tests import tasks

BLOCK = 2.5  # seconds the blocking task holds the GIL


@pytest.fixture
def board() -> Iterator[ClaimBoard]:
    probe = f"{_shm.PREFIX}claimstest-{os.getpid()}-{time.monotonic_ns()}"
    made = ClaimBoard.create(probe)
    assert made is not None
    seen = ClaimBoard.attach(probe)
    assert seen is not None and made.open_lock()
    made.unlink()  # as the handshake's end does: both stay usable
    assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]
    yield made
    made.close()
    seen.close()


def test_a_task_taken_back_is_never_run_and_one_decided_is_never_taken() -> None:
    probe = f"{_shm.PREFIX}claimstest-{os.getpid()}-{time.monotonic_ns()}"
    worker_side = ClaimBoard.create(probe)
    assert worker_side is not None
    executor_side = ClaimBoard.attach(probe)
    assert executor_side is not None and worker_side.open_lock()
    try:
        assert worker_side.claim(0) is True  # running task 0; 1 to 4 wait behind it
        assert executor_side.take_back([1, 2, 3, 4]) == {1, 2, 3, 4}
        assert [worker_side.claim(n) for n in (1, 2, 3, 4)] == [False] * 4
        assert worker_side.claim(5) is True  # sent after: the worker's
        assert executor_side.take_back([7]) == {7}  # a cancel of one in the middle
        assert executor_side.take_back([8, 9]) == {8, 9}  # and more, before it got there
        assert [worker_side.claim(n) for n in (6, 7, 8, 9, 10)] == [True, False, False,
                                                                    False, True]
        assert executor_side.take_back([9, 10, 11]) == {11}  # 9 and 10 were decided
        # 12 was given back over the link (never claimed); its bit is cleared as passed
        assert executor_side.take_back([12]) == {12}
        assert [worker_side.claim(n) for n in (11, 13)] == [False, True]
        assert worker_side.claim(12 + BITS) is True  # the same bit, a later number
        assert executor_side.take_back([13 + BITS]) == {13 + BITS}
        assert worker_side.claim(13 + BITS) is False
    finally:
        executor_side.close()
        worker_side.close()
    assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]


@pytest.mark.parametrize("first", ["worker", "executor"])
def test_the_worker_makes_the_page_and_the_executor_the_semaphore(first: str) -> None:
    """Making a named semaphore is not atomic (glibc writes a temporary file first), and
    workers get killed: the worker only opens the one the executor made. The executor
    keeps its name until the worker has it open; then either side's unlink removes what is
    left, and the other's finds nothing to do."""
    probe = f"{_shm.PREFIX}claimstest-{os.getpid()}-{time.monotonic_ns()}"
    assert ClaimBoard.attach(probe) is None  # (no page made yet: the worker is told so)
    made = ClaimBoard.create(probe)
    assert made is not None
    assert [n for n in os.listdir(_shm.SHM_DIR) if probe in n] == [f"{probe}-claims"]
    assert not made.open_lock()  # (no semaphore until the executor's)
    seen = ClaimBoard.attach(probe)
    assert seen is not None
    try:
        seen.unlink(semaphore=False)  # the Hello seen: the page's name goes
        assert [n for n in os.listdir(_shm.SHM_DIR) if probe in n] == [f"sem.{probe}-claims"]
        assert made.open_lock()
        sides = [made, seen] if first == "worker" else [seen, made]
        sides[0].unlink()  # the Setup read (the worker), or the worker let go (the executor)
        assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]
        assert made.claim(0) is True and seen.take_back([1]) == {1}  # still shared
        assert made.claim(1) is False
        sides[1].unlink()
    finally:
        made.close()
        seen.close()


def test_a_busy_board_answers_later_not_wrongly(board: ClaimBoard) -> None:
    board._lock.acquire()  # the worker in the middle of a claim
    try:
        assert board.take_back([0, 1, 2]) is None
    finally:
        board._lock.release()
    assert board.take_back([0, 1, 2]) == {0, 1, 2}


@pytest.mark.parametrize("executor", [ProcessPoolExecutor, FiberExecutor])
def test_no_task_waits_behind_one_that_holds_the_gil(executor: type) -> None:
    """A worker's task blocks in C holding the GIL for seconds: the tasks it was sent to
    run next go to the other worker, and all finish long before it (the stdlib's pool
    never sends a worker more than it runs)."""
    with executor(2) as ex:
        # The function is known short (so tasks are sent to wait behind its calls).
        assert list(ex.map(tasks.gil_sleep, [0] * 50, range(50), timeout=60)) == list(range(50))
        blocker = ex.submit(tasks.gil_sleep, BLOCK, -1)
        quick = [ex.submit(tasks.gil_sleep, 0, i) for i in range(2000)]
        started = time.monotonic()
        for _ in as_completed(quick, timeout=BLOCK + 60):
            pass
        assert not blocker.done(), (
            f"the quick tasks took {time.monotonic() - started:.1f}s: they waited for the "
            "one holding the GIL")
        assert [f.result() for f in quick] == list(range(2000))
        assert blocker.result(timeout=BLOCK + 60) == -1


@pytest.mark.parametrize("executor", [ProcessPoolExecutor, FiberExecutor])
def test_a_task_waiting_behind_one_that_holds_the_gil_can_be_cancelled(
        executor: type, tmp_path: Path) -> None:
    """Its worker cannot answer while the GIL is held: the board answers for it (asking the
    worker, `cancel` gave up after 2 s and said False, and the task ran after all)."""
    fifo = tmp_path / "said"
    os.mkfifo(fifo)
    with executor(1) as ex:
        assert list(ex.map(tasks.gil_sleep, [0] * 50, range(50), timeout=60)) == list(range(50))
        blocker = ex.submit(tasks.gil_sleep, BLOCK, -1, str(fifo))
        behind = [ex.submit(tasks.gil_sleep, 0, i) for i in range(10)]
        with open(fifo) as said:  # the blocker is about to take the GIL into C
            assert said.readline() == "holding\n"
        for i in (9, 7, 8):  # each at once, in any order
            assert behind[i].cancel()
            assert behind[i].cancelled()
        assert [f.result(timeout=BLOCK + 60) for f in behind[:7]] == list(range(7))
        assert blocker.result(timeout=60) == -1


def test_a_local_worker_busy_holding_the_gil_past_silence_timeout_is_not_lost() -> None:
    """Its heartbeats cannot go out while its task holds the GIL in C; it is at work (its
    CPU time grows), not hung, so it is not lost (it was: its task ran three times, then
    failed). A worker silent and idle, stopped or deadlocked, still is: test_failures."""
    with FiberExecutor(1, heartbeat=0.1, silence_timeout=0.5) as ex:
        assert ex.submit(tasks.gil_busy, 1.2, "done").result(timeout=60) == "done"
        stats = ex.stats()
    assert (stats.workers_lost, stats.tasks_retried, stats.tasks_failed) == (0, 0, 0)


def test_an_initializer_busy_holding_the_gil_past_silence_timeout_breaks_nothing() -> None:
    with FiberExecutor(1, heartbeat=0.1, silence_timeout=0.5, initializer=tasks.gil_busy,
                       initargs=(1.2,)) as ex:
        assert ex.submit(tasks.square, 4).result(timeout=60) == 16
        assert ex.stats().workers_lost == 0
