"""The public backend seam: subclass `Backend` to run workers somewhere new.

Register the subclass under the ``fiberexec.backends`` entry-point group to make it available
by name (``FiberExecutor(backend="mine")``). A backend imports only this module from fiberexec:
everything an adapter needs (the spec and status types, the error tree it translates into,
the worker program's contract, `ExitWatch` to report each exit once, `Launcher` to fork
workers on one host from a process that imported the worker program once, the optional
capabilities of the ``fiberexec`` command) is here. ``fiberexec.testing`` checks a backend
against the seam's contract.
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
from fiberexec._capabilities import (
    DEFAULT_SERVICE_ACCOUNT,
    MASTER_LABEL,
    CapabilityError,
    MasterRequest,
    Probe,
    configured_backend_options,
    first_line,
)
from fiberexec._contract import (
    ENV_ADDRESS,
    ENV_CONNECT_TIMEOUT,
    ENV_EXECUTOR_ID,
    ENV_LOCAL_ADDRESS,
    ENV_NONCE,
    ENV_SECRET,
    ENV_WORKER_ID,
    WORKER_COMMAND,
)
from fiberexec._errors import (
    BackendError,
    ConfigurationError,
    FiberExecError,
    PermanentBackendError,
    TransientBackendError,
)
from fiberexec._fdlimit import readable_within
from fiberexec._imports import learn_names, names_to_teach
from fiberexec._launcher import (
    ENV_PRELOAD,
    WORKER_PROGRAM,
    ForkedProcess,
    Launcher,
    LauncherError,
    SharedLaunchers,
    shared_launchers,
)
from fiberexec._procstate import share_tracker as share_resource_tracker
from fiberexec._registry import (
    available_backends,
    backend_class,
    check_backend_name,
    load_backend,
)
from fiberexec._retry import RetryPolicy
from fiberexec._sweep import LEASE_LABEL, Sweep, lease_name
from fiberexec._threads import key as thread_key
from fiberexec._threads import limit as thread_limits
from fiberexec._watch import ExitWatch

__all__ = [
    "DEFAULT_SERVICE_ACCOUNT",
    "ENV_ADDRESS",
    "ENV_CONNECT_TIMEOUT",
    "ENV_EXECUTOR_ID",
    "ENV_LOCAL_ADDRESS",
    "ENV_NONCE",
    "ENV_PRELOAD",
    "ENV_SECRET",
    "ENV_WORKER_ID",
    "EXECUTOR_LABEL",
    "LABEL_KEY",
    "LEASE_LABEL",
    "MASTER_LABEL",
    "WORKER_COMMAND",
    "WORKER_LABEL",
    "WORKER_PROGRAM",
    "Backend",
    "BackendError",
    "CapabilityError",
    "ConfigurationError",
    "ExitListener",
    "ExitWatch",
    "FiberExecError",
    "ForkedProcess",
    "Launcher",
    "LauncherError",
    "MasterRequest",
    "PermanentBackendError",
    "Probe",
    "Resources",
    "RetryPolicy",
    "SharedLaunchers",
    "SignalNotSupportedError",
    "Sweep",
    "TransientBackendError",
    "WorkerHandle",
    "WorkerSpec",
    "WorkerState",
    "WorkerStatus",
    "available_backends",
    "backend_class",
    "check_backend_name",
    "configured_backend_options",
    "first_line",
    "learn_names",
    "lease_name",
    "load_backend",
    "names_to_teach",
    "parse_memory",
    "readable_within",
    "share_resource_tracker",
    "shared_launchers",
    "thread_key",
    "thread_limits",
]
