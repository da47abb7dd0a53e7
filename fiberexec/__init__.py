"""fiberexec: run Python work across processes, containers and clusters.

`FiberExecutor` is a `concurrent.futures.Executor` whose workers are local processes,
Docker containers or Kubernetes pods.

Names are imported on first use, so the worker program (``python -m fiberexec.worker``)
starts without loading the executor's machinery.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
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
    from fiberexec._executor import (
        FiberExecutor,
    )
    from fiberexec._retry import (
        RetryPolicy,
    )
    from fiberexec._serialize import (
        RemoteTraceback,
    )
    from fiberexec._stats import (
        Stats,
    )

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "AuthenticationError": "fiberexec._errors",
    "BackendError": "fiberexec._errors",
    "BrokenFiberExecutor": "fiberexec._errors",
    "ConfigurationError": "fiberexec._errors",
    "FiberExecError": "fiberexec._errors",
    "FiberExecutor": "fiberexec._executor",
    "PermanentBackendError": "fiberexec._errors",
    "ProtocolError": "fiberexec._errors",
    "RemoteTraceback": "fiberexec._serialize",
    "RetryPolicy": "fiberexec._retry",
    "SerializationError": "fiberexec._errors",
    "Stats": "fiberexec._stats",
    "TransientBackendError": "fiberexec._errors",
    "WorkerLostError": "fiberexec._errors",
}

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


def __getattr__(name: str) -> _typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fiberexec' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
