"""Executor configuration: validated once into an immutable value that is passed down."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fiberexec._backend import Resources, parse_memory
from fiberexec._errors import ConfigurationError
from fiberexec._retry import RetryPolicy

ENV_BACKEND = "FIBEREXEC_BACKEND"
DEFAULT_MAX_MESSAGE = 1 << 31


@dataclass(frozen=True)
class ExecutorConfig:
    max_workers: int
    min_workers: int
    backend: str
    initializer: Callable[..., object] | None = None
    initargs: tuple[Any, ...] = ()
    max_tasks_per_child: int | None = None
    max_task_retries: int = 2
    idle_timeout: float | None = None
    shards: int = 1
    image: str | None = None
    workdir: str | None = None
    resources: Resources = field(default_factory=Resources)
    labels: Mapping[str, str] = field(default_factory=dict)
    heartbeat: float = 1.0
    start_timeout: float = 120.0
    start_retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_message_size: int = DEFAULT_MAX_MESSAGE
    backend_options: Mapping[str, Any] = field(default_factory=dict)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigurationError(message)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(f"{name} must be an int, got {value!r}")
    return value


def resolve(
    max_workers: int | None,
    *,
    backend: str | None,
    min_workers: int | None,
    shards: int | None,
    memory: int | str | None,
    cpu: float | None,
    gpu: int,
    **options: Any,
) -> ExecutorConfig:
    """Explicit arguments, then ``FIBEREXEC_*`` environment variables, then defaults."""
    if max_workers is None:
        max_workers = os.cpu_count() or 1
    else:
        max_workers = _positive_int("max_workers", max_workers)
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
    if min_workers is None:
        min_workers = max_workers
    _require(
        0 <= _positive_int("min_workers", min_workers) <= max_workers,
        f"min_workers must be between 0 and max_workers={max_workers}, got {min_workers}",
    )
    if shards is None:
        shards = max(1, min(16, -(-max_workers // 256)))
    _require(
        1 <= _positive_int("shards", shards) <= max_workers,
        f"shards must be between 1 and max_workers={max_workers}, got {shards}",
    )
    mtpc = options.get("max_tasks_per_child")
    if mtpc is not None:
        _require(isinstance(mtpc, int) and mtpc >= 1, "max_tasks_per_child must be >= 1")
    retries = options.get("max_task_retries", 2)
    _require(
        isinstance(retries, int) and retries >= 0,
        f"max_task_retries must be an int >= 0, got {retries!r}",
    )
    for name in ("heartbeat", "start_timeout"):
        if name in options:
            value = options[name]
            _require(
                isinstance(value, int | float) and value > 0,
                f"{name} must be a number of seconds > 0, got {value!r}",
            )
    idle = options.get("idle_timeout")
    _require(
        idle is None or (isinstance(idle, int | float) and idle > 0),
        f"idle_timeout must be None or seconds > 0, got {idle!r}",
    )
    init = options.get("initializer")
    _require(init is None or callable(init), f"initializer must be callable, got {init!r}")
    return ExecutorConfig(
        max_workers=max_workers,
        min_workers=min_workers,
        backend=backend or os.environ.get(ENV_BACKEND) or "local",
        shards=shards,
        resources=Resources(cpu=cpu, memory=parse_memory(memory), gpu=gpu),
        **options,
    )
