"""Signal handlers held off while a caller's thread does a shard's work (or starts the pool).

A thread that submits or waits sends tasks and reads results itself when the shard's thread
sleeps (`Shard._dispatch_here`, `Shard.collect`). On the main thread, the interpreter runs
the program's signal handlers between bytecodes, and an exception one raises (Ctrl-C's
``KeyboardInterrupt``, a SIGALRM handler's timeout, a SIGTERM handler's ``SystemExit``)
could land between reading a worker's results off its socket and settling their futures:
the results were gone, the futures never finished, and the ``with`` block's
``shutdown(wait=True)`` waited for them forever. So for that stretch (a few microseconds of
work, or at most the 5 ms a waiting thread reads for) every signal with a handler written
in Python is only noted, and the program's handlers run once the shard's state is whole
again: the program sees its exception where it waited, as with the standard library's
executor. (``SIG_DFL`` and ``SIG_IGN`` need no holding: the kernel acts on them.)

Holding must never lose a handler, although an exception can come between any two calls
here too: a `Held` that is no longer holding passes each signal to the program's handler,
so one left installed (its release cut short) behaves as that handler, and the next `hold`
puts that handler back in its place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from fiberexec._signals import CATCHABLE, getsignal, setsignal


class Held:
    """The program's handlers while held, and the signals that came meanwhile."""

    __slots__ = ("came", "holding", "previous")

    def __init__(self) -> None:
        self.previous: dict[int, Callable[[int, FrameType | None], Any]] = {}
        self.came: list[tuple[int, FrameType | None]] = []
        self.holding = True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.holding:
            self.came.append((signum, frame))
            return
        handler = self.previous.get(signum)  # left installed: be the program's handler
        if handler is not None:
            handler(signum, frame)


_seen: list[Any] = []  # every signal's handler at the last `hold`
_python_ones: list[tuple[int, Callable[[int, FrameType | None], Any]]] = []  # of those


def _handled_in_python(handlers: list[Any]) -> list[tuple[int, Any]]:
    """The signals whose handler is a Python callable, each with the program's handler."""
    found = []
    for signum, handler in zip(CATCHABLE, handlers, strict=True):
        if isinstance(handler, Held):  # one a cut-short release left: the program's is in it
            handler = handler.previous.get(signum)  # noqa: PLW2901
        if callable(handler):
            found.append((signum, handler))
    return found


def hold() -> Held | None:
    """Hold off the Python signal handlers on this thread, if handlers run here (None:
    nothing held)."""
    if threading.get_ident() != threading.main_thread().ident:
        return None  # signal handlers run on the main thread only (asked each time: a
        # fork from another thread makes that thread the child's main thread)
    global _seen, _python_ones
    held = Held()
    try:
        handlers = list(map(getsignal, CATCHABLE))  # (in C: a Python loop took 5 us)
        if handlers != _seen:  # which have Python handlers, worked out when that changes
            _python_ones = _handled_in_python(handlers)
            _seen = handlers
        for signum, handler in _python_ones:
            held.previous[signum] = handler  # before the swap: it is never lost
            setsignal(signum, held)
    except ValueError:  # not the main interpreter: handlers run elsewhere
        held.holding = False
        return None
    except BaseException:  # a handler not yet held raised: the held ones act as before
        held.holding = False
        raise
    return held


def release(held: Held | None) -> None:
    """Give the program its handlers back, and run those whose signals came meanwhile (the
    default SIGINT handler raises ``KeyboardInterrupt`` here)."""
    if held is None:
        return
    held.holding = False  # from here on, a signal reaching it goes to the program's handler
    for signum, handler in held.previous.items():
        setsignal(signum, handler)
    for signum, frame in held.came:
        held.previous[signum](signum, frame)
