"""The public backend seam: subclass `Backend` to run workers somewhere new.

Register the subclass under the ``fiberexec.backends`` entry-point group to make it available
by name (``FiberExecutor(backend="mine")``).
"""

from __future__ import annotations

from fiberexec._backend import (
    EXECUTOR_LABEL,
    LABEL_KEY,
    WORKER_LABEL,
    Backend,
    ExitListener,
    Resources,
    SignalNotSupportedError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    parse_memory,
)
from fiberexec._errors import BackendError, PermanentBackendError, TransientBackendError
from fiberexec._registry import available_backends, load_backend
from fiberexec._retry import RetryPolicy

__all__ = [
    "EXECUTOR_LABEL",
    "LABEL_KEY",
    "WORKER_LABEL",
    "Backend",
    "BackendError",
    "ExitListener",
    "PermanentBackendError",
    "Resources",
    "RetryPolicy",
    "SignalNotSupportedError",
    "TransientBackendError",
    "WorkerHandle",
    "WorkerSpec",
    "WorkerState",
    "WorkerStatus",
    "available_backends",
    "load_backend",
    "parse_memory",
]
