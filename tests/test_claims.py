"""Tasks a worker holds behind a task that will not let go of the interpreter lock.

A worker on the executor's host shares a claim board with it (`fiberexec._claims`), so the
tasks sent to wait behind its running one come back to the queue without the worker's
answer: none waits for a task that holds the GIL in C while another worker idles, and none
runs twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pytest

from fiberexec import FiberExecutor, _shm
from fiberexec._claims import ClaimBoard
from tests import tasks

BLOCK = 4.0  # seconds the blocking task holds the GIL


@pytest.fixture
def board() -> Iterator[ClaimBoard]:
    probe = f"{_shm.PREFIX}claimstest-{os.getpid()}-{time.monotonic_ns()}"
    made = ClaimBoard.create(probe)
    assert made is not None
    seen = ClaimBoard.attach(probe)
    assert seen is not None
    made.unlink()  # as the handshake's end does: both stay usable
    assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]
    yield made
    made.close()
    seen.close()


def test_a_task_taken_back_is_never_run_and_one_decided_is_never_taken() -> None:
    probe = f"{_shm.PREFIX}claimstest-{os.getpid()}-{time.monotonic_ns()}"
    executor_side = ClaimBoard.create(probe)
    assert executor_side is not None
    worker_side = ClaimBoard.attach(probe)
    assert worker_side is not None
    try:
        assert worker_side.claim(0) is True  # running task 0; 1 to 4 wait behind it
        assert executor_side.cut(1, 5) == 1  # all four come back
        assert [worker_side.claim(n) for n in (1, 2, 3, 4)] == [False] * 4
        assert worker_side.claim(5) is True  # sent after the cut: the worker's
        assert worker_side.claim(6) is True
        assert executor_side.cut(7, 9) == 7
        assert worker_side.claim(7) is False
        # The worker has not passed that cut (8 is undecided): no new one until it has.
        assert executor_side.cut(9, 10) is None
        assert worker_side.claim(8) is False
        assert worker_side.claim(9) is True  # decided before the executor asks for it
        assert executor_side.cut(9, 12) == 10  # so only what follows comes back
        assert [worker_side.claim(n) for n in (10, 11, 12)] == [False, False, True]
        assert executor_side.cut(13, 14) == 13
        assert executor_side.cut(14, 15) is None  # 13 is undecided yet
    finally:
        executor_side.close()
        worker_side.close()
    assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]


def test_a_busy_board_answers_later_not_wrongly(board: ClaimBoard) -> None:
    board._lock.acquire()  # the worker in the middle of a claim
    try:
        assert board.cut(0, 3) is None
    finally:
        board._lock.release()
    assert board.cut(0, 3) == 0


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
        assert behind[-1].cancel()
        assert behind[-1].cancelled()
        assert [f.result(timeout=BLOCK + 60) for f in behind[:-1]] == list(range(9))
        assert blocker.result(timeout=60) == -1
