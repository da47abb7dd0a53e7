"""fiberexec: run Python work across processes, containers and clusters.

`FiberExecutor` is a `concurrent.futures.Executor` whose workers are local processes,
Docker containers or Kubernetes pods.

Names are imported on first use, so the worker program (``python -m fiberexec.worker``)
starts without loading the executor's machinery.
"""

from __future__ import annotations

import importlib as _importlib
import logging as _logging
import typing as _typing

from fiberexec import _start_method

if _typing.TYPE_CHECKING:
    from builtins import TimeoutError  # what Future.result(timeout=) raises

    from fiberexec._errors import (
        AuthenticationError,
        BackendError,
        BrokenFiberExecutor,
        ConfigurationError,
        FiberExecError,
        PerformanceWarning,
        PermanentBackendError,
        PicklingError,
        ProtocolError,
        SerializationError,
        TransientBackendError,
        UnpicklingError,
        WorkerLostError,
    )
    from fiberexec._executor import (
        FiberExecutor,
    )
    from fiberexec._fiber import init, reset
    from fiberexec._fiber_queues import SimpleQueuePush
    from fiberexec._logging import enable_logging
    from fiberexec._observe import Durations, FailureInfo, TaskInfo, TaskSpan, WorkerInfo
    from fiberexec._progress import ProgressBar, progress_bar
    from fiberexec._retry import (
        RetryPolicy,
    )
    from fiberexec._serialize import (
        RemoteTraceback,
    )
    from fiberexec._stats import (
        Stats,
    )
    from fiberexec._tls import TLSOptions
    from fiberexec.multiprocessing import (
        BufferTooShort,
        JoinableQueue,
        Manager,
        Pipe,
        Pool,
        Process,
        ProcessError,
        Queue,
        SimpleQueue,
        active_children,
        cpu_count,
        current_process,
        get_context,
        meta,
    )

__version__ = "0.1.0"

# As the logging HOWTO asks of a library: a do-nothing handler on the package's logger, so its
# records reach no stream (not even logging's last-resort stderr handler) until the
# application configures logging or calls `enable_logging`.
_logging.getLogger("fiberexec").addHandler(_logging.NullHandler())

# ``multiprocessing.get_context("fiber")`` (and ``set_start_method("fiber")``) in the standard
# library: a library that takes a start method's name starts fiberexec's processes
_start_method.register()

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "AuthenticationError": "fiberexec._errors",
    "BackendError": "fiberexec._errors",
    "BrokenFiberExecutor": "fiberexec._errors",
    "BufferTooShort": "fiberexec.multiprocessing",
    "ConfigurationError": "fiberexec._errors",
    "Durations": "fiberexec._observe",
    "FailureInfo": "fiberexec._observe",
    "FiberExecError": "fiberexec._errors",
    "FiberExecutor": "fiberexec._executor",
    "JoinableQueue": "fiberexec.multiprocessing",
    "Manager": "fiberexec.multiprocessing",
    "PermanentBackendError": "fiberexec._errors",
    "PicklingError": "fiberexec._errors",
    "PerformanceWarning": "fiberexec._errors",
    "Pipe": "fiberexec.multiprocessing",
    "Pool": "fiberexec.multiprocessing",
    "Process": "fiberexec.multiprocessing",
    "ProcessError": "fiberexec.multiprocessing",
    "ProtocolError": "fiberexec._errors",
    "Queue": "fiberexec.multiprocessing",
    "RemoteTraceback": "fiberexec._serialize",
    "RetryPolicy": "fiberexec._retry",
    "SerializationError": "fiberexec._errors",
    "SimpleQueue": "fiberexec.multiprocessing",
    "Stats": "fiberexec._stats",
    "TLSOptions": "fiberexec._tls",
    "TaskInfo": "fiberexec._observe",
    "TaskSpan": "fiberexec._observe",
    "TimeoutError": "builtins",  # catches Future.result(timeout=) and Pool timeouts alike
    "TransientBackendError": "fiberexec._errors",
    "UnpicklingError": "fiberexec._errors",
    "WorkerInfo": "fiberexec._observe",
    "WorkerLostError": "fiberexec._errors",
    "ProgressBar": "fiberexec._progress",
    "progress_bar": "fiberexec._progress",
    "enable_logging": "fiberexec._logging",
    "active_children": "fiberexec.multiprocessing",
    "cpu_count": "fiberexec.multiprocessing",
    "current_process": "fiberexec.multiprocessing",
    "meta": "fiberexec.multiprocessing",
    "SimpleQueuePush": "fiberexec._fiber_queues",  # Fiber 0.2.1's names
    "init": "fiberexec._fiber",
    "reset": "fiberexec._fiber",
    "get_context": "fiberexec.multiprocessing",
}
# submodules reached as attributes, as Fiber's ``fiber.config`` and ``fiber.managers`` are
_SUBMODULES = frozenset({"config", "managers"})

__all__ = [
    "AuthenticationError",
    "BackendError",
    "BrokenFiberExecutor",
    "BufferTooShort",
    "ConfigurationError",
    "Durations",
    "FailureInfo",
    "FiberExecError",
    "FiberExecutor",
    "JoinableQueue",
    "Manager",
    "PerformanceWarning",
    "PermanentBackendError",
    "PicklingError",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "ProgressBar",
    "ProtocolError",
    "Queue",
    "RemoteTraceback",
    "RetryPolicy",
    "SerializationError",
    "SimpleQueue",
    "SimpleQueuePush",
    "Stats",
    "TLSOptions",
    "TaskInfo",
    "TaskSpan",
    "TimeoutError",
    "TransientBackendError",
    "UnpicklingError",
    "WorkerInfo",
    "WorkerLostError",
    "active_children",
    "cpu_count",
    "current_process",
    "enable_logging",
    "get_context",
    "init",
    "meta",
    "progress_bar",
    "reset",
]


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"fiberexec.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fiberexec' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
