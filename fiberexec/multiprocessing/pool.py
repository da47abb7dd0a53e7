"""``multiprocessing.pool`` for ``fiberexec.multiprocessing``: the same names.

`Pool` is ours (on `FiberExecutor`); `ThreadPool` is the stdlib's (threads of this process,
nothing to distribute); the error classes are the stdlib's, which ours raise.
"""

from __future__ import annotations

import multiprocessing.pool as _stdlib
from multiprocessing.pool import ThreadPool

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._errors import TimeoutError  # (the package's, as the stdlib's)
from fiberexec.multiprocessing._pool import (
    CLOSE,
    RUN,
    TERMINATE,
    ApplyResult,
    AsyncResult,
    IMapIterator,
    MapResult,
    Pool,
)

MaybeEncodingError = _stdlib.MaybeEncodingError  # type: ignore[attr-defined]
RemoteTraceback = _stdlib.RemoteTraceback  # type: ignore[attr-defined]
INIT = "INIT"  # (the stdlib's states, as `Pool._state` holds them)

__all__ = [
    "CLOSE",
    "INIT",
    "RUN",
    "TERMINATE",
    "ApplyResult",
    "AsyncResult",
    "IMapIterator",
    "MapResult",
    "MaybeEncodingError",
    "Pool",
    "RemoteTraceback",
    "ThreadPool",
    "TimeoutError",
]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
