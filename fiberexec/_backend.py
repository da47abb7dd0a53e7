"""The backend seam: how the executor asks for workers, and nothing more.

A backend turns a `WorkerSpec` into a running job (a process, a container, a pod) that runs
``python -m fiberexec.worker``, reports its status, stops it, and returns its logs. Backends
never reach into the executor: everything they need is in the spec. Adapters translate their
SDK's errors into `TransientBackendError` (worth retrying) or `PermanentBackendError`.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self

from fiberexec._errors import BackendError, ConfigurationError
from fiberexec._sweep import Sweep

if TYPE_CHECKING:  # _capabilities imports _config, which imports this module
    from fiberexec._capabilities import MasterRequest, Probe

#: Label present on every job fiberexec starts, so strays can be found and removed.
LABEL_KEY = "fiberexec"
EXECUTOR_LABEL = "fiberexec.executor"
WORKER_LABEL = "fiberexec.worker"

_MEMORY_UNITS = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def parse_memory(value: int | str | None) -> int | None:
    """Return a memory amount in bytes from an int or a string such as ``"512Mi"``/``"2G"``."""
    if value is None or isinstance(value, int):
        if isinstance(value, int) and value <= 0:
            raise ConfigurationError(f"memory must be > 0 bytes, got {value}; pass e.g. '2Gi'")
        return value
    match = _MEMORY_RE.match(value)
    if match is None:
        raise ConfigurationError(
            f"memory must be bytes or a quantity like '512Mi' or '2G', got {value!r}"
        )
    number, unit = match.groups()
    return int(float(number) * _MEMORY_UNITS[(unit or "").lower()])


@dataclass(frozen=True)
class Resources:
    """What one worker may use. ``None`` means the backend's default (no limit)."""

    cpu: float | None = None
    memory: int | None = None  # bytes
    gpu: int = 0

    def __post_init__(self) -> None:
        if self.cpu is not None and self.cpu <= 0:
            raise ConfigurationError(f"cpu must be > 0, got {self.cpu}; pass e.g. cpu=1 or 0.5")
        if self.memory is not None and self.memory <= 0:
            raise ConfigurationError(f"memory must be > 0 bytes, got {self.memory}")
        if self.gpu < 0:
            raise ConfigurationError(f"gpu must be >= 0, got {self.gpu}")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a backend needs to start one worker.

    ``env`` is plain configuration; ``secret_env`` holds values (the executor's secret) that a
    backend must deliver without exposing them in a job description (a Kubernetes Secret, not a
    literal in the pod spec). Both are environment variables inside the worker.
    ``script_dir`` is the directory of the program's main script (None: an interactive
    session, or ``python -m``): workers import modules beside the script from there, as a
    spawned stdlib child does, so a backend that mounts ``workdir`` mounts it too.
    """

    worker_id: str
    executor_id: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    workdir: str | None = None
    resources: Resources = Resources()
    labels: Mapping[str, str] = field(default_factory=dict)
    script_dir: str | None = None

    def all_labels(self) -> dict[str, str]:
        """The spec's labels plus the ones that name the executor and the worker."""
        return {
            **self.labels,
            LABEL_KEY: "worker",
            EXECUTOR_LABEL: self.executor_id,
            WORKER_LABEL: self.worker_id,
        }


@dataclass(frozen=True)
class WorkerHandle:
    """A backend's reference to one started worker (``ref``: pid, container id, pod name)."""

    worker_id: str
    ref: str


class WorkerState(enum.Enum):
    PENDING = "pending"  # accepted but not running yet (pulling, scheduling)
    RUNNING = "running"
    EXITED = "exited"  # ran and stopped; exit_code says how
    FAILED = "failed"  # never ran (image pull error, unschedulable): reason says why
    UNKNOWN = "unknown"  # the backend has no record of it (removed)


@dataclass(frozen=True)
class WorkerStatus:
    """A worker's state; ``exit_code`` is negative for a signal, as in `subprocess`."""

    state: WorkerState
    exit_code: int | None = None
    reason: str | None = None  # the backend's own words: "OOMKilled", "Evicted", ...

    @property
    def finished(self) -> bool:
        return self.state in (WorkerState.EXITED, WorkerState.FAILED, WorkerState.UNKNOWN)

    def describe(self) -> str:
        """A phrase for error messages: ``exited with code 137 (OOMKilled)``."""
        if self.exit_code is not None and self.exit_code < 0:
            text = f"was killed by signal {-self.exit_code} ({_signal_name(-self.exit_code)})"
        elif self.exit_code is not None:
            text = f"exited with code {self.exit_code}"
        else:
            text = f"is {self.state.value}"
        return f"{text} ({self.reason})" if self.reason else text


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


ExitListener = Callable[[WorkerHandle, WorkerStatus], None]


def _unsupported(backend: str, capability: str) -> Exception:
    from fiberexec._capabilities import unsupported  # it imports _config, which imports us

    return unsupported(backend, capability)


class SignalNotSupportedError(BackendError, NotImplementedError):
    """A backend cannot deliver this signal to a worker (`Backend.signal`).

    Callers fall back to `Backend.stop`. It is a `NotImplementedError` too, so code that
    probes for an optional operation with ``except NotImplementedError`` keeps working.
    """


class Backend(abc.ABC):
    """Starts, inspects and stops job-backed workers. Subclass it to add a backend.

    The class holds no state: it is the interface and its defaults. The operations are
    synchronous and may block on I/O; the executor calls them from its launcher threads, never
    from its scheduling thread. ``watch`` reports workers that finish: a backend composes an
    `ExitWatch` (``fiberexec.backend.ExitWatch``) and feeds it from its own event stream (a
    Docker event stream, a Kubernetes watch), or lets it poll `status` every
    ``poll_interval`` seconds.
    """

    name: str = "backend"
    #: Host the executor's sockets bind to, and the host workers are told to dial.
    bind_host: str = "127.0.0.1"
    advertise_host: str = "127.0.0.1"
    poll_interval: float = 1.0
    #: Whether `WorkerSpec.resources` limits (cpu, memory) are enforced on the worker's job;
    #: when False, the ``fiberexec.multiprocessing`` layer logs that they are not.
    enforces_resources: bool = False
    #: How each `Resources` setting ("cpu", "memory", "gpu") is applied to a worker, in a few
    #: words (``{"memory": "--mem"}``); a setting left out is not enforced. ``fiberexec info``
    #: shows it; a backend that leaves it empty is described by `enforces_resources` alone.
    resource_limits: ClassVar[Mapping[str, str]] = {}
    #: Whether the jobs this backend starts can run this process's interpreter
    #: (`sys.executable`): on this machine, or through a filesystem shared with it.
    #: ``fiberexec run`` then runs a program's leading ``python``/``python3`` with it.
    shares_python: bool = False
    #: Whether every worker runs on this host, in this network namespace, as this user, so
    #: the local link always reaches the executor: then no network listener is opened for
    #: it (a worker that cannot reach the local socket fails to start, saying so).
    workers_share_host: bool = False

    def __new__(cls, *args: object, **kwargs: object) -> Self:
        missing = sorted({"watch", "unwatch"} & getattr(cls, "__abstractmethods__", set()))
        if missing:
            raise TypeError(
                f"backend {cls.__name__} does not implement "
                f"{' and '.join(f'Backend.{m}()' for m in missing)}; compose a "
                "fiberexec.backend.ExitWatch and delegate watch/unwatch to it (see its "
                "docstring)"
            )
        return super().__new__(cls)

    @abc.abstractmethod
    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        """Start one worker; raise `TransientBackendError` or `PermanentBackendError`."""

    @abc.abstractmethod
    def status(self, handle: WorkerHandle) -> WorkerStatus:
        """Return the worker's current state (never raises for a worker that is gone)."""

    @abc.abstractmethod
    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        """Stop the worker (SIGTERM, then SIGKILL after ``grace``) and remove its job.

        A stopped worker is not reported by `watch`: call `unwatch` first.
        """

    @abc.abstractmethod
    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        """Return the last ``tail`` lines the worker wrote, or ``""`` if none were kept."""

    @abc.abstractmethod
    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        """Call ``listener(handle, status)`` once, from any thread, when the worker finishes.

        Also when it finished before the call. Compose an `ExitWatch`: ``watch`` it there,
        `ExitWatch.report` each exit the backend sees (or `ExitWatch.poll` `status`).
        """

    @abc.abstractmethod
    def unwatch(self, handle: WorkerHandle) -> None:
        """Stop reporting on ``handle`` (it was stopped on purpose); `ExitWatch.unwatch`."""

    def signal(self, handle: WorkerHandle, sig: int) -> None:
        """Send signal ``sig`` to the worker's program; optional for a backend.

        The worker's exit (if the signal ends it) is reported by `watch` and `status` as any
        other exit, with ``exit_code == -sig``. Signalling a worker that already exited does
        nothing. Backends that cannot deliver signals keep this default.

        Raises:
            SignalNotSupportedError: this backend (or this signal on it) is not supported;
                call `stop` instead.
        """
        raise SignalNotSupportedError(
            f"the {self.name!r} backend cannot send signal {_signal_name(sig)} to worker "
            f"{handle.worker_id}; use stop() to end it, or implement {type(self).__name__}"
            ".signal()"
        )

    def close(self) -> None:  # noqa: B027  # optional: a backend may have nothing to release
        """Stop every worker this backend started and release its threads and clients.

        Idempotent. The default does nothing: a backend that starts workers overrides it
        (stopping, too, what its `ExitWatch` still holds, from `ExitWatch.clear`).
        """

    # -- optional capabilities, looked up by the ``fiberexec`` command (see _capabilities) --

    @classmethod
    def launch_master(cls, request: MasterRequest) -> int:
        """Run ``request.command`` as the master job here; return its exit status."""
        raise _unsupported(cls.name, "launch_master")

    @classmethod
    def probe(cls) -> Probe:
        """Whether this backend is usable on this machine, without starting anything."""
        raise _unsupported(cls.name, "probe")

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """Remove the workers ``sweep`` picks; one line per worker, naming its worker id.

        The contract (``fiberexec.testing.check_remove_stray``): by default only workers
        whose executor's lease is gone go (see `Sweep`: every executor holds a lease its
        workers name, testable from any process); a worker whose lease this backend cannot
        test stays, and a line says so. ``sweep.executor_id`` removes that executor's
        workers, ``sweep.everything`` every worker; ``sweep.dry_run`` removes nothing and
        returns the lines it would. Raises `BackendError` when the engine cannot be asked.
        """
        raise _unsupported(cls.name, "remove_stray")

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
