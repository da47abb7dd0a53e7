"""Every time limit of the multiprocessing layer, and the deadlines that count them down.

One value, `TIMING`, holds each timeout and interval; every module reads it here when it
needs a limit (``_timing.TIMING.slice``), never a copy of its own, so a test that gives a
process shorter limits replaces this one name and every part of the layer sees them. A wait
with a limit counts down a `Deadline`, whose clock is a parameter, so what a deadline
decides can be tested without waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

Clock = Callable[[], float]
T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """Every time limit of the multiprocessing layer, in seconds."""

    connect: float = 3.0  # a dial; a pipe reader's host silent by then is relayed to
    handshake: float = 10.0  # a connection's peer proves the secret within this
    stream: float = 30.0  # a connection to a broker or manager is made and proves the secret
    hello: float = 10.0  # a pipe reader answers a direct writer, else the broker relays
    requery: float = 0.02  # a writer relayed through the broker asks for a route again
    requery_most: float = 1.0  # after this, twice as long each time up to this (a reader
    # not yet reading is found soon; a pipe read by its creator costs a call a second)
    fetch: float = 10.0  # a pipe end's descriptor comes over from the process sharing it
    slice: float = 5.0  # one blocking request (a get, an acquire, a wait) waits in a broker
    feed: float = 5.0  # an exiting process waits for its `Feeder` to send what it holds
    leave: float = 5.0  # an exiting process waits for its direct routes to settle, and for
    # its brokers to read what it sent them
    count: float = 2.0  # ``qsize()`` waits for consumers elsewhere to say what they hold
    gave_up: float = 2.0  # a queue get that gave up waits for what was sent to it (`Settled`)
    hold: float = 0.002  # a socket stays with the thread that read its last answer
    call: float = 120.0  # an answer may take this beyond the time its request asks to wait
    heartbeat: float = 5.0  # a waiting call checks that its server is alive this often
    ping: float = 30.0  # a live server answers that check within this
    flush: float = 60.0  # a proxy's flush waits for the releases sent before it
    release: float = 5.0  # a collected pipe end's release reaches its broker (and at exit)
    settle: float = 1.0  # a writer rechecks a route to a pipe's reader that is settling
    pid: float = 30.0  # a started child reports its pid within this
    gone: float = 2.0  # a child seen ended: its parent's broker reads its connections' ends
    gone_check: float = 0.2  # a broker's wait for a client checks this often that it is there
    grace: float = 0.5  # a job stopped where signals cannot reach it: SIGTERM, then SIGKILL
    manager_start: float = 120.0  # a manager's server process starts and says where it is
    manager_shutdown: float = 5.0  # a manager's server shuts down and exits
    output_age: float = 1.0  # a line a child printed without a flush waits this at most
    output_final: float = 10.0  # a child's last lines reach its parent as it exits


TIMING = Timing()


class Deadline:
    """The moment ``timeout`` seconds from now on ``clock`` (None: no limit)."""

    __slots__ = ("at", "clock")

    def __init__(self, timeout: float | None, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.at = None if timeout is None else clock() + max(0.0, timeout)

    def left(self) -> float | None:
        """Seconds left, never below 0; None without a limit."""
        return None if self.at is None else max(0.0, self.at - self.clock())

    def passed(self) -> bool:
        return self.at is not None and self.clock() >= self.at


def _never() -> bool:
    return False


def in_pieces(wait: Callable[[float], bool], timeout: float | None, piece: float, *,
              stop: Callable[[], bool] = _never, clock: Clock = time.monotonic) -> bool:
    """Call ``wait(seconds)``, for at most ``piece`` seconds each time, until it returns True
    (then True), or ``timeout`` passes (None: never) or ``stop()`` says to give up between
    pieces (then False). A wait that cannot watch for everything that should end it (a
    client hanging up, a server thread held for good) is cut this way."""
    deadline = Deadline(timeout, clock)
    while True:
        left = deadline.left()
        if wait(piece if left is None else min(piece, left)):
            return True
        if stop() or deadline.passed():
            return False


def in_slices(timeout: float | None, attempt: Callable[[float], bool]) -> bool:
    """A blocking request to a broker or manager, made as ``attempt(seconds)`` until it
    succeeds or ``timeout`` passes (None: never): each attempt waits there `Timing.slice`
    at most, so a client that vanishes mid-wait holds a server thread for one slice."""
    return in_pieces(attempt, timeout, TIMING.slice)


def wait_until(predicate: Callable[[], T], wait: Callable[[float | None], object],
               timeout: float | None, clock: Clock = time.monotonic) -> T:
    """``predicate()``'s first true value, calling ``wait(seconds left)`` (a condition's
    ``wait``) before each look after the first; its last value once ``timeout`` passes."""
    result = predicate()
    deadline = Deadline(timeout, clock)
    while not result:
        left = deadline.left()
        if left == 0:
            break
        wait(left)
        result = predicate()
    return result
