"""The multiprocessing exception types, shared with the standard library.

``ProcessError`` and ``BufferTooShort`` are the standard library's own classes. `TimeoutError`
derives from both ``multiprocessing.TimeoutError`` and the builtin ``TimeoutError`` (which is
``concurrent.futures.TimeoutError``), so ``except multiprocessing.TimeoutError`` and
``except fiberexec.TimeoutError`` (the builtin, which ``Future.result(timeout=)`` raises) both
catch ours. `AuthenticationError` is both the standard library's and fiberexec's (a
`ProtocolError`), so either ``except`` works. `RemoteError` lives in `_remote_error`, loaded
with the managers.
"""

from __future__ import annotations

import builtins as _builtins
import multiprocessing as _std

from fiberexec._errors import AuthenticationError as _FiberAuthenticationError

ProcessError = _std.ProcessError
BufferTooShort = _std.BufferTooShort


class TimeoutError(_std.TimeoutError, _builtins.TimeoutError):
    """A result was not ready within the timeout."""


class AuthenticationError(_FiberAuthenticationError, _std.AuthenticationError):
    """A peer failed the HMAC handshake of a queue, pipe, process or manager connection."""


__all__ = ["AuthenticationError", "BufferTooShort", "ProcessError", "TimeoutError"]
