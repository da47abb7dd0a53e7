"""fiberexec's error tree.

Users write ``except`` clauses against this hierarchy::

    FiberExecError
     ├── ConfigurationError (also ValueError)   a bad argument or setting
     ├── BackendError                           a backend could not do what was asked
     │    ├── TransientBackendError             worth retrying (5xx, 429, conflicts, unreachable)
     │    └── PermanentBackendError             retrying cannot help (bad image, forbidden)
     ├── ProtocolError                          a malformed, oversized or unexpected message
     │    └── AuthenticationError               a peer that does not hold the executor's secret
     ├── SerializationError                     a function, argument or result cannot be pickled
     └── WorkerLostError                        a task whose workers kept dying
    concurrent.futures.BrokenExecutor
     └── BrokenFiberExecutor                    the executor cannot run tasks any more

A task that raises re-raises its own exception; the remote traceback rides in ``__cause__``.
"""

from __future__ import annotations

from concurrent.futures import BrokenExecutor


class FiberExecError(Exception):
    """Base class of every error fiberexec raises on its own account."""


class ConfigurationError(FiberExecError, ValueError):
    """An argument or setting breaks a rule; the message names the rule, the value and the fix."""


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


class SerializationError(FiberExecError):
    """A function, its arguments or its result could not be pickled or unpickled."""


class WorkerLostError(FiberExecError):
    """A task was running on workers that died, ``max_task_retries`` times over."""


class BrokenFiberExecutor(BrokenExecutor):
    """The executor can no longer run tasks (a worker could not start, an initializer failed)."""
