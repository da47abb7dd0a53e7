"""The multiprocessing exception types, shared with the standard library.

``ProcessError``, ``BufferTooShort`` and ``TimeoutError`` are the standard library's own
classes, so ``except multiprocessing.TimeoutError`` catches ours. `AuthenticationError` is
both the standard library's and fiberexec's (a `ProtocolError`), so either ``except`` works.
"""

from __future__ import annotations

import multiprocessing as _std

from fiberexec._errors import AuthenticationError as _FiberAuthenticationError

ProcessError = _std.ProcessError
BufferTooShort = _std.BufferTooShort
TimeoutError = _std.TimeoutError  # the multiprocessing name, on purpose


class AuthenticationError(_FiberAuthenticationError, _std.AuthenticationError):
    """A peer failed the HMAC handshake of a queue, pipe, process or manager connection."""


class RemoteError(ProcessError):
    """A manager-side error that could not be sent back as itself (its text is kept)."""


__all__ = ["AuthenticationError", "BufferTooShort", "ProcessError", "RemoteError", "TimeoutError"]
