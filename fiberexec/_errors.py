"""fiberexec's error tree.

Users write ``except`` clauses against this hierarchy; where a situation is the same as in the
standard library, the class also derives from the standard library's, so code written for
`concurrent.futures.ProcessPoolExecutor` and `pickle` keeps catching it::

    FiberExecError
     ├── ConfigurationError (also ValueError)   a bad argument or setting
     ├── BackendError                           a backend could not do what was asked
     │    ├── TransientBackendError             worth retrying (5xx, 429, conflicts, unreachable)
     │    └── PermanentBackendError             retrying cannot help (bad image, forbidden)
     ├── ProtocolError                          a malformed, oversized or unexpected message
     │    └── AuthenticationError               a peer that does not hold the executor's secret
     ├── SerializationError (pickle.PickleError)
     │    ├── PicklingError (pickle.PicklingError)        a function, argument or result
     │    │                                               cannot be pickled
     │    └── UnpicklingError (pickle.UnpicklingError,    a task or result cannot be rebuilt
     │                         BrokenProcessPool)         on the other side
     └── WorkerLostError (BrokenProcessPool)    a task whose workers kept dying
    concurrent.futures.BrokenExecutor
     └── concurrent.futures.process.BrokenProcessPool
          └── BrokenFiberExecutor               the executor cannot run tasks any more

`UnpicklingError` is also a `BrokenProcessPool` because that is what the standard library
raises when a task or a result cannot be unpickled (its worker or result thread dies of it);
fiberexec fails only that one future and carries on. A task that raises re-raises its own
exception; the remote traceback rides in ``__cause__`` as the standard library's
``concurrent.futures.process._RemoteTraceback``.

The three classes that derive from `BrokenProcessPool` live in `fiberexec._broken`, imported
on first use: ``concurrent.futures.process`` takes a new interpreter 16 ms to import, and a
worker (a new interpreter on every backend but the local launcher's forks) needs them only
to report a failure.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fiberexec._broken import BrokenFiberExecutor, UnpicklingError, WorkerLostError

__all__ = [
    "AuthenticationError", "BackendError", "BrokenFiberExecutor", "ConfigurationError",
    "FiberExecError", "LinkClosed", "PermanentBackendError", "PicklingError", "ProtocolError",
    "SerializationError", "TransientBackendError", "UnpicklingError", "WorkerLostError",
]


class FiberExecError(Exception):
    """Base class of every error fiberexec raises on its own account."""


class ConfigurationError(FiberExecError, ValueError):
    """An argument or setting breaks a rule; the message names the rule, the value and the fix."""


class ConfigurationTypeError(ConfigurationError, TypeError):
    """An argument of the wrong kind: a `TypeError` where the standard library raises one
    (``initializer=5``), and a `ConfigurationError` like every other bad setting."""


class BackendError(FiberExecError):
    """A backend could not start, inspect or stop a worker."""


class TransientBackendError(BackendError):
    """A backend failure that may pass (overload, conflict, daemon briefly unreachable).

    Args:
        retry_after: seconds the remote side asked us to wait, when it said so.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentBackendError(BackendError):
    """A backend failure that retrying cannot fix (image not found, forbidden, invalid spec)."""


class ProtocolError(FiberExecError):
    """A message that is malformed, oversized, out of order or of an unknown kind."""


class AuthenticationError(ProtocolError):
    """A peer failed the HMAC handshake: it does not hold the executor's secret."""


class SerializationError(FiberExecError, pickle.PickleError):
    """A function, its arguments or its result could not be pickled or unpickled."""


class PicklingError(SerializationError, pickle.PicklingError):
    """A function, its arguments or its result could not be pickled."""

    # Where it was at hand: a short repr of what could not be pickled, and of what the
    # pickler raised (the cause itself may not travel back from a worker)
    shown: str | None = None
    reason: str | None = None


_AS_ALSO: dict[type[BaseException], type[PicklingError]] = {}


def pickling_error(message: str, cause: BaseException | None) -> PicklingError:
    """A `PicklingError` that is also an instance of what the pickler raised (``cause``: a
    ``TypeError`` for a lock, a ``RecursionError`` for a deep structure...), so that code
    written for the standard library, whose futures hold the pickler's own exception,
    catches it as it did, and code written for fiberexec as it does."""
    kind = _as_also(type(cause)) if isinstance(cause, Exception) else None
    error = PicklingError(message) if kind is None else kind(message)
    error.__cause__ = cause
    return error


def _as_also(base: type[BaseException]) -> type[PicklingError] | None:
    if issubclass(base, PicklingError) or base in (Exception, pickle.PicklingError,
                                                   pickle.PickleError):
        return None
    kind = _AS_ALSO.get(base)
    if kind is None:
        try:
            kind = type("PicklingError", (PicklingError, base),
                        {"__module__": __name__, "__qualname__": "PicklingError",
                         "__reduce__": _reduce_as_also})
        except TypeError:  # its instances' layout cannot be combined with ours
            return None
        _AS_ALSO[base] = kind
    return kind


def _reduce_as_also(error: PicklingError) -> tuple[Any, ...]:
    base = next(k for k, v in _AS_ALSO.items() if v is type(error))
    return _rebuild_as_also, (base, error.args), error.__dict__ or None


def _rebuild_as_also(base: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    kind = _as_also(base)
    return PicklingError(*args) if kind is None else kind(*args)


class PerformanceWarning(UserWarning):
    """Something about how tasks are written makes them much slower than they need be (a
    script's function that brings megabytes of globals with every batch of tasks). Shown
    once per function, at its definition; ``warnings.filterwarnings("ignore",
    category=fiberexec.PerformanceWarning)`` turns it off."""


class LinkClosed(ConnectionError):
    """The other end of a link hung up (internal: workers exit on it, shards lose the peer)."""


def __getattr__(name: str) -> Any:
    if name in ("UnpicklingError", "WorkerLostError", "BrokenFiberExecutor"):
        from fiberexec import _broken  # the import lock makes them once

        return getattr(_broken, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
