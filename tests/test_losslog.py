"""Hundreds of losses make a few lines: the first ones, then one summary per window."""

from __future__ import annotations

import logging

import pytest

from fiberexec._losslog import FIRST, WINDOW, LossLog


def test_losses_beyond_the_first_are_summed_up_once_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    losses = LossLog()
    with caplog.at_level(logging.WARNING, logger="fiberexec"):
        for i in range(300):
            why = "stopped responding (nothing heard for 31.0s)" if i % 3 else "exited with code 1"
            losses.lost(f"worker w{i} {why}", now=100.0 + i * 0.01)
        losses.flush(100.0 + 3.5)  # the window is still open: nothing yet
        assert len(caplog.records) == FIRST
        losses.flush(100.0 + WINDOW)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == FIRST + 1
    assert lines[-1].startswith(f"{300 - FIRST} more workers lost in 10s (")
    assert "197 stopped responding, 98 exited with code 1" in lines[-1]
    assert lines[-1].endswith("the latest: worker w299 stopped responding "
                              "(nothing heard for 31.0s)")


def test_a_new_window_logs_its_first_losses_again(caplog: pytest.LogCaptureFixture) -> None:
    losses = LossLog()
    with caplog.at_level(logging.WARNING, logger="fiberexec"):
        for i in range(FIRST + 2):
            losses.lost(f"worker w{i} exited with code 1", now=0.0)
        losses.lost("worker w99 exited with code 1", now=WINDOW + 1)  # closes the old window
    lines = [r.getMessage() for r in caplog.records]
    assert lines[FIRST].startswith("2 more workers lost")
    assert lines[-1] == "worker w99 exited with code 1"


def test_the_summary_agrees_in_number(caplog: pytest.LogCaptureFixture) -> None:
    losses = LossLog()
    with caplog.at_level(logging.WARNING, logger="fiberexec"):
        for i in range(FIRST + 3):
            why = "was killed by signal 9 (SIGKILL)" if i != FIRST + 2 else "exited with code 1"
            losses.lost(f"worker w{i} {why}", now=0.0)
        losses.flush(WINDOW)
        losses.lost("worker w50 was killed by signal 9 (SIGKILL)", now=2 * WINDOW)
        for i in range(FIRST):
            losses.lost(f"worker w{60 + i} exited with code 1", now=2 * WINDOW)
        losses.flush(3 * WINDOW)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[FIRST].startswith("3 more workers lost in 10s (2 were killed by signal 9, "
                                   "1 exited with code 1)")
    assert lines[-1].startswith("1 more worker lost in 10s (1 exited with code 1)")


@pytest.mark.parametrize(("code", "said"), [
    (-11, "otherwise the task crashes its process (a fault in native code)"),
    (-6, "otherwise the task crashes its process (a fault in native code)"),
    (-9, "otherwise check the task's memory use (the kernel's out-of-memory killer"),
    (-15, "otherwise the workers were signalled: by something outside them"),
    (3, "otherwise the task ends its process (os._exit, or exit() in native code?)"),
])
def test_the_hint_for_a_lost_task_follows_how_its_worker_ended(code: int, said: str) -> None:
    """A SIGTERM from outside is not blamed on the task's native code, nor an exit status
    on its memory."""
    from fiberexec._backend import WorkerState, WorkerStatus
    from fiberexec._crash import Loss, hint

    status = WorkerStatus(WorkerState.EXITED, exit_code=code)
    assert said in hint((Loss("w1", status.describe(), status),), 2)
