"""Ctrl-C held off while a caller's thread does a shard's work (or starts the pool).

A thread that submits or waits sends tasks and reads results itself when the shard's thread
sleeps (`Shard._dispatch_here`, `Shard.collect`). On the main thread, the interpreter runs
the SIGINT handler between any two bytecodes, and the ``KeyboardInterrupt`` it raises could
land between reading a worker's results off its socket and settling their futures: the
results were gone, the futures never finished, and the ``with`` block's
``shutdown(wait=True)`` waited for them forever. So for that stretch (a few microseconds of
work, or at most the 5 ms a waiting thread reads for) the handler only notes the signal, and
the one the program had runs once the shard's state is whole again: the program sees its
``KeyboardInterrupt`` where it waited, as with the standard library's executor.

Only SIGINT is held, and only while the program's handler is a Python one: the default
handler's exit (``SIG_DFL``) needs no holding, and a handler of the program's that raises
on other signals is its own choice.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class Held:
    """The program's SIGINT handler, and the signal if it came meanwhile."""

    __slots__ = ("came", "frame", "previous")

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.came = False
        self.frame: FrameType | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.came = True
        self.frame = frame


def hold() -> Held | None:
    """Hold off SIGINT's handler on this thread, if handlers run here (None: nothing held)."""
    if threading.get_ident() != threading.main_thread().ident:
        return None  # signal handlers run on the main thread only (asked each time: a
        # fork from another thread makes that thread the child's main thread)
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_DFL (the kernel ends the process), SIG_IGN, or unset
        return None
    held = Held(previous)
    try:
        signal.signal(signal.SIGINT, held)
    except ValueError:  # not the main interpreter
        return None
    return held


def release(held: Held | None) -> None:
    """Give the program its handler back; run it if the signal came meanwhile (the default
    one raises ``KeyboardInterrupt`` here)."""
    if held is None:
        return
    signal.signal(signal.SIGINT, held.previous)
    if held.came:
        held.previous(signal.SIGINT, held.frame)
