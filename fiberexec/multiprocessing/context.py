"""``multiprocessing.context`` for ``fiberexec.multiprocessing``: contexts and the errors."""

from __future__ import annotations

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._context import (
    BaseContext,
    get_all_start_methods,
    get_context,
    get_start_method,
    set_start_method,
)
from fiberexec.multiprocessing._errors import (
    AuthenticationError,
    BufferTooShort,
    ProcessError,
    TimeoutError,
)
from fiberexec.multiprocessing._process import ForkProcess, ForkServerProcess, SpawnProcess

__all__ = [
    "AuthenticationError",
    "BaseContext",
    "BufferTooShort",
    "ForkProcess",
    "ForkServerProcess",
    "ProcessError",
    "SpawnProcess",
    "TimeoutError",
    "get_all_start_methods",
    "get_context",
    "get_start_method",
    "set_start_method",
]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
