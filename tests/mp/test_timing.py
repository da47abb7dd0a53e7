"""The layer's deadlines, on a clock that moves only when a wait here moves it."""

from __future__ import annotations

import threading

import pytest

from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._timing import Deadline, in_pieces, wait_until
from tests.support.clock import FakeClock


class Waits:
    """A wait on ``clock`` that takes all the time it is given (``step``: that much at
    most), and succeeds at its ``ready_after``-th call."""

    def __init__(self, clock: FakeClock, ready_after: int | None = None,
                 step: float | None = None) -> None:
        self.clock = clock
        self.asked: list[float | None] = []
        self.ready_after = ready_after
        self.step = step

    def __call__(self, seconds: float | None) -> bool:
        self.asked.append(seconds)
        if self.ready_after is not None and len(self.asked) >= self.ready_after:
            return True
        assert seconds is not None, "a wait without a limit would block for ever"
        self.clock.now += seconds if self.step is None else min(self.step, seconds)
        return False


def test_a_deadline_counts_down_never_below_zero_and_none_is_no_limit() -> None:
    clock = FakeClock(100.0)
    deadline = Deadline(1.5, clock)
    assert deadline.left() == 1.5 and not deadline.passed()
    clock.now += 1.0
    assert deadline.left() == 0.5
    clock.now += 1.0
    assert deadline.left() == 0.0 and deadline.passed()
    assert Deadline(-3, clock).left() == 0.0  # a negative timeout is no time at all
    endless = Deadline(None, clock)
    clock.now += 1e9
    assert endless.left() is None and not endless.passed()


def test_a_wait_in_pieces_gives_up_at_its_timeout_with_a_short_last_piece() -> None:
    clock = FakeClock(100.0)
    waits = Waits(clock)
    assert not in_pieces(waits, 2.5, 1.0, clock=clock)
    assert waits.asked == [1.0, 1.0, 0.5] and clock.now == 102.5


def test_a_wait_in_pieces_ends_when_the_wait_succeeds_or_stop_says_so() -> None:
    clock = FakeClock(100.0)
    ready = Waits(clock, ready_after=3)
    assert in_pieces(ready, None, 0.2, clock=clock)  # no limit: pieces until it succeeds
    assert ready.asked == [0.2, 0.2, 0.2]
    gone = iter([False, False, True])
    waits = Waits(clock)
    assert not in_pieces(waits, None, 0.2, stop=lambda: next(gone), clock=clock)
    assert len(waits.asked) == 3  # (the caller hung up after the third piece)


def test_wait_until_returns_the_predicate_value_or_gives_up_at_the_timeout() -> None:
    clock = FakeClock(100.0)
    values = iter([0, 0, "yes"])
    waits = Waits(clock, step=1.0)  # woken after a second each time
    assert wait_until(lambda: next(values), waits, 10.0, clock) == "yes"
    assert waits.asked == [10.0, 9.0]
    waits = Waits(clock)
    assert wait_until(lambda: [], waits, 3.0, clock) == []
    assert waits.asked == [3.0]  # the first wait took it all; the last look is after it


@pytest.mark.parametrize("timeout", [None, 0.05])
def test_wait_until_on_a_real_condition_is_woken_by_a_notify(timeout: float | None) -> None:
    """As `threading.Condition.wait_for`: a notify ends the wait, and a timeout that runs
    out returns the predicate's last value."""
    cond = threading.Condition()
    state = {"ready": False}
    if timeout is None:
        def later() -> None:
            with cond:
                state["ready"] = True
                cond.notify_all()

        timer = threading.Timer(0.05, later)
        timer.start()
        with cond:
            assert wait_until(lambda: state["ready"], cond.wait, timeout) is True
        timer.join()
    else:
        with cond:
            assert wait_until(lambda: state["ready"], cond.wait, timeout) is False


def test_every_part_of_the_layer_reads_the_one_timing_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing `_timing.TIMING` reaches every reader (none keeps a copy of its own: a
    structure test checks that too): `in_slices` cuts a request by the new slice."""
    monkeypatch.setattr(_timing, "TIMING", _timing.Timing(slice=0.01))
    asked: list[float] = []

    def attempt(seconds: float) -> bool:
        asked.append(seconds)
        return len(asked) == 2

    assert _timing.in_slices(None, attempt)
    assert asked == [0.01, 0.01]
