"""The multiprocessing exception types, shared with the standard library.

``ProcessError`` and ``BufferTooShort`` are the standard library's own classes. `TimeoutError`
derives from both ``multiprocessing.TimeoutError`` and the builtin ``TimeoutError`` (which is
``concurrent.futures.TimeoutError``), so ``except multiprocessing.TimeoutError`` and
``except fiberexec.TimeoutError`` (the builtin, which ``Future.result(timeout=)`` raises) both
catch ours. `AuthenticationError` is both the standard library's and fiberexec's (a
`ProtocolError`), so either ``except`` works.
"""

from __future__ import annotations

import builtins as _builtins
import multiprocessing as _std
import multiprocessing.managers as _std_managers

from fiberexec._errors import AuthenticationError as _FiberAuthenticationError

ProcessError = _std.ProcessError
BufferTooShort = _std.BufferTooShort


class TimeoutError(_std.TimeoutError, _builtins.TimeoutError):
    """A result was not ready within the timeout."""


class AuthenticationError(_FiberAuthenticationError, _std.AuthenticationError):
    """A peer failed the HMAC handshake of a queue, pipe, process or manager connection."""


class RemoteError(ProcessError, _std_managers.RemoteError):
    """A manager-side error that could not be sent back as itself (its text is kept), or
    one raised making a shared object (as the standard library's managers raise it); also
    the standard library's ``multiprocessing.managers.RemoteError``."""

    def __str__(self) -> str:
        return Exception.__str__(self)


__all__ = ["AuthenticationError", "BufferTooShort", "ProcessError", "RemoteError", "TimeoutError"]
