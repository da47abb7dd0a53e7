"""``multiprocessing.context`` for ``fiberexec.multiprocessing``: contexts and the errors."""

from __future__ import annotations

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

__all__ = [
    "AuthenticationError",
    "BaseContext",
    "BufferTooShort",
    "ProcessError",
    "TimeoutError",
    "get_all_start_methods",
    "get_context",
    "get_start_method",
    "set_start_method",
]
