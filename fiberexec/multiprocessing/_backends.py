"""Which backend `Process`, `Pool`, `Manager` and the broker use, and resource hints.

The backend, its ``backend_options`` and the worker ``image`` come from the executor's own
configuration (`fiberexec._config.resolve`: ``FIBEREXEC_*`` variables, then
``.fiberexec.toml`` or ``pyproject.toml``, then defaults), resolved once per process on first
use; `set_default_backend` overrides the backend for this process, like
`multiprocessing.set_start_method`, and makes the next use resolve the configuration again.
`Pool` gets a fresh backend instance each (a backend's worker ids are per executor);
processes share one.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fiberexec._backend import (
    Backend,
    Resources,
    parse_memory,
)
from fiberexec._config import MIN_WORKER_MEMORY, ExecutorConfig, resolve
from fiberexec._errors import ConfigurationError
from fiberexec.multiprocessing._links import outward_ip

log = logging.getLogger("fiberexec.multiprocessing")
BackendLike = str | Backend | Callable[[], Backend]
_default: BackendLike | None = None
_shared: Backend | None = None
_config: ExecutorConfig | None = None
_lock = threading.RLock()  # `shared_backend` resolves the configuration under it


def configuration() -> ExecutorConfig:
    """The executor's configuration of this process, resolved once (see the module)."""
    global _config
    with _lock:
        if _config is None:
            _config = resolve()
        return _config


def set_default_backend(backend: BackendLike | None) -> None:
    """Run new processes, pools and managers on ``backend`` (a name or a factory).

    Pass a name (``"docker"``), a zero-argument callable returning a `Backend`, or None for
    the configuration's backend (``FIBEREXEC_BACKEND``, else the config file's, else
    ``"local"``; read again on next use). A `Backend` instance is used for processes only
    (pools need their own). Call it before the first queue or process is created: the
    broker binds to the host this backend's workers can reach.
    """
    global _default, _shared, _config
    if backend is not None and not (isinstance(backend, str | Backend) or callable(backend)):
        raise ConfigurationError(
            f"backend must be a name, a Backend or a factory, got {backend!r}"
        )
    with _lock:
        _default, old, _shared, _config = backend, _shared, None, None
    if old is not None:
        old.close()


def new_backend(choice: BackendLike | None = None,
                options: dict[str, Any] | None = None) -> Backend:
    """A new backend instance for ``choice`` (default: the default backend).

    A backend made by name gets ``options``, else the configuration's ``backend_options``
    when the configuration names the same backend.
    """
    from fiberexec._registry import load_backend

    choice = _default if choice is None else choice
    if choice is None or isinstance(choice, str):
        config = configuration()
        name = config.backend if choice is None else choice
        if options is None:
            options = dict(config.backend_options) if name == config.backend else {}
        return load_backend(name, **options)
    if isinstance(choice, Backend):
        return choice
    backend = choice()
    if not isinstance(backend, Backend):
        raise ConfigurationError(f"backend factory returned {backend!r}, not a Backend")
    return backend


def shared_backend() -> Backend:
    """The backend processes run on (one instance per process, closed at exit)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = new_backend()
            atexit.register(_close_at_exit, _shared)
        return _shared


def _close_at_exit(backend: Backend) -> None:
    """(atexit) Close it; a later use (an exit handler registered before this one) gets a
    new backend."""
    global _shared
    with _lock:
        if _shared is backend:
            _shared = None
    backend.close()


ENV_PARENT_ADDRESS = "FIBEREXEC_MP_ADDRESS"  # in a child: its parent's broker (see `_process`)


def broker_hosts() -> tuple[str, str]:
    """Where this process's servers (its broker, a manager's server) listen, and the host
    other processes dial them at.

    The backend's hosts, except in a child that reaches its parent over a network while
    its own backend would listen on loopback (a child's is ``local``): it then listens on
    the address it reaches its parent from, so the parent and its other children, on other
    hosts, can reach what it serves (a `Queue` it made, a manager's objects)."""
    backend = shared_backend()
    bind, advertise = backend.bind_host, backend.advertise_host
    parent = os.environ.get(ENV_PARENT_ADDRESS)
    if parent and (bind.startswith("127.") or bind in ("localhost", "::1")):
        ip = outward_ip(parent)
        if ip is not None:
            return ip, ip
    return bind, advertise


@dataclass(frozen=True)
class Meta:
    cpu: float | None = None
    memory: int | None = None
    gpu: int = 0

    def resources(self) -> Resources:
        return Resources(cpu=self.cpu, memory=self.memory, gpu=self.gpu)


def meta(*, cpu: float | None = None, memory: int | str | None = None,
         gpu: int = 0) -> Callable[[Any], Any]:
    """Attach the resources a function needs; `Process` and `Pool` pass them to the backend.

    ``memory``: a whole number is MiB, Fiber's unit for ``fiber.meta`` (and for its
    ``mem_per_job``), so ``@fiber.meta(memory=1000)`` asks for 1000 MiB as it did there; a
    quantity (``"512Mi"``, ``"2G"``) says its unit. At least 16 MiB, as every worker's.

    Backends that cannot enforce them (local) run the function anyway and log a note.

    Example:
        >>> @meta(cpu=2, memory="1Gi")
        ... def simulate(seed): ...
    """
    hint = Meta(cpu=cpu, memory=_meta_memory(memory), gpu=gpu)
    hint.resources()  # validate now, name the bad value

    def attach(fn: Any) -> Any:
        fn.__fiberexec_meta__ = hint
        return fn

    return attach


def _meta_memory(memory: int | str | None) -> int | None:
    """`meta`'s ``memory`` in bytes: a whole number (or its digits) is MiB."""
    unreadable = ConfigurationError(
        f"meta's memory must be MiB as a whole number (Fiber's unit) or a quantity like "
        f"'512Mi', got {memory!r}")
    if isinstance(memory, bool) or not isinstance(memory, int | str | None):
        raise unreadable
    if isinstance(memory, str) and memory.strip().isdigit():
        memory = int(memory)
    try:
        size = memory << 20 if isinstance(memory, int) else parse_memory(memory)
    except ConfigurationError:
        raise unreadable from None
    if size is not None and not MIN_WORKER_MEMORY <= size <= MAX_META_MEMORY:
        raise ConfigurationError(
            f"meta's memory must be from 16 MiB to 1 PiB per worker, got {memory!r}; a "
            "whole number is MiB (Fiber's unit): write e.g. memory=512 or memory='512Mi'")
    return size


MAX_META_MEMORY = 1 << 50  # 1 PiB: a whole number this large was meant as bytes, not MiB


def meta_of(fn: object) -> Meta | None:
    hint = getattr(fn, "__fiberexec_meta__", None)
    return hint if isinstance(hint, Meta) else None


def note_unenforced(backend: Backend, resources: Resources) -> None:
    """Log the ``resources`` asked of a backend that does not enforce them (by name)."""
    if backend.enforces_resources:
        return
    asked = {name: value for name in ("cpu", "memory", "gpu")
             if (value := getattr(resources, name))}
    unenforced = {k: v for k, v in asked.items() if k not in backend.resource_limits}
    if unenforced:
        settings = ", ".join(f"{k}={v}" for k, v in unenforced.items())
        log.info("the %s backend does not enforce %s; the work may run without those limits",
                 backend.name, settings)
