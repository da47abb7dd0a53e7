"""fiberexec: run Python work across processes, containers and clusters.

`FiberExecutor` is a `concurrent.futures.Executor` whose workers are local processes,
Docker containers or Kubernetes pods.
"""

from __future__ import annotations

from fiberexec._errors import (
    AuthenticationError,
    BackendError,
    BrokenFiberExecutor,
    ConfigurationError,
    FiberExecError,
    PermanentBackendError,
    ProtocolError,
    SerializationError,
    TransientBackendError,
    WorkerLostError,
)
from fiberexec._executor import FiberExecutor
from fiberexec._retry import RetryPolicy
from fiberexec._serialize import RemoteTraceback
from fiberexec._stats import Stats

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "BackendError",
    "BrokenFiberExecutor",
    "ConfigurationError",
    "FiberExecError",
    "FiberExecutor",
    "PermanentBackendError",
    "ProtocolError",
    "RemoteTraceback",
    "RetryPolicy",
    "SerializationError",
    "Stats",
    "TransientBackendError",
    "WorkerLostError",
]
