"""The signal module's own ``getsignal`` and ``signal``, for code that reads every signal's
handler on a hot path (`_interrupts` at each round trip, `_procstate` at each worker start).

`signal`'s wrappers convert numbers and handlers to enums, at ten times the cost of the C
functions beneath them; these take and give plain numbers (``SIG_IGN`` is 1, ``SIG_DFL`` 0).
"""

from __future__ import annotations

import importlib
import signal
from collections.abc import Callable
from typing import Any, cast


def _functions() -> tuple[Callable[[int], Any], Callable[[int, Any], Any]]:
    try:
        module = importlib.import_module("_signal")
    except ImportError:  # pragma: no cover - an interpreter without it
        return signal.getsignal, signal.signal
    return cast("Callable[[int], Any]", module.getsignal), cast(
        "Callable[[int, Any], Any]", module.signal)


getsignal, setsignal = _functions()

# Every signal a handler can be set for (SIGKILL and SIGSTOP cannot have one).
CATCHABLE = tuple(sorted(int(s) for s in signal.valid_signals()
                         if s not in (signal.SIGKILL, signal.SIGSTOP)))
IGNORE = int(signal.SIG_IGN)
DEFAULT = int(signal.SIG_DFL)


def ignored(handler: object) -> bool:
    """Whether ``handler`` (as `getsignal` gives it) ignores its signal."""
    return isinstance(handler, int) and handler == IGNORE
