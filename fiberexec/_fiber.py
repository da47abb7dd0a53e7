"""Fiber 0.2.1's configuration API over fiberexec's settings, so code written for Fiber runs
with ``import fiberexec as fiber``.

Fiber is configured process-wide: ``fiber.init(backend="docker", cpu_per_job=2)``, or
``fiber.config.backend = "docker"`` (or ``FIBER_*`` environment variables and a
``.fiberconfig`` file, which the configuration reads: `fiberexec._fiber_keys`). Here each Fiber
key maps onto the fiberexec setting that means the same, and `init` sets it as this
process's default the way fiberexec takes process-wide defaults, through its ``FIBEREXEC_*``
environment variable (so an executor's explicit arguments still win, and the workers it
starts inherit nothing they would not otherwise). Reading ``fiber.config.<key>`` gives the
value an executor built now would use.

    fiber.init(**kwargs) / fiber.config.key = v --> FIBEREXEC_<SETTING> --> every executor
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType
from typing import Any

from fiberexec._config import ENV_PREFIX, resolve
from fiberexec._errors import ConfigurationError
from fiberexec._fiber_keys import KEYS, LOGGING, SETTINGS, unset
from fiberexec._logging import enable_logging

log = logging.getLogger("fiberexec")
# What `init` changed, as it was before (`reset` puts it back): each variable's value (None:
# unset), and the logger's level and handlers.
_before_env: dict[str, str | None] = {}
_before_logging: tuple[int, list[logging.Handler]] | None = None


def init(**kwargs: Any) -> None:
    """Set Fiber configuration keys as this process's defaults (Fiber's ``fiber.init``).

    ``backend``, ``image``, ``cpu_per_job`` (CPUs per worker) and ``mem_per_job`` (MiB per
    worker) become fiberexec's ``backend``, ``image``, ``cpu`` and ``memory``;
    ``ipc_admin_master_port`` its ``ports``; ``log_level``, ``log_file`` (``"stdout"`` or a
    path) and ``debug`` configure the ``fiberexec`` logger. A value of None (or Fiber's
    port 0, "any port") goes back to fiberexec's default.

    Raises:
        ConfigurationError: a key Fiber does not have, or a value the setting refuses.

    Example:
        >>> import fiberexec as fiber
        >>> fiber.init(backend="local", cpu_per_job=1)  # doctest: +SKIP
    """
    unknown = sorted(set(kwargs) - KEYS)
    if unknown:
        raise ConfigurationError(f"fiber.init got unknown key(s) {unknown}; Fiber's keys "
                                 f"are {sorted(KEYS)}")
    for key, value in kwargs.items():
        if key in SETTINGS:
            _set(key, value)
        elif key in LOGGING:
            _configure_logging(key, value)
        else:
            log.debug("fiber.init: %s=%r has no meaning for fiberexec; ignored", key, value)


def _set(key: str, value: object) -> None:
    setting, write = SETTINGS[key]
    name = ENV_PREFIX + setting.upper()
    if unset(key, value):
        _before_env.setdefault(name, os.environ.get(name))
        os.environ.pop(name, None)
        return
    text = write(value)
    before = os.environ.get(name)
    _before_env.setdefault(name, before)
    os.environ[name] = text
    try:
        resolve({})  # the setting's own check, naming the value and the rule
    except ConfigurationError as exc:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
        raise ConfigurationError(f"fiber.init({key}={value!r}): {exc}") from exc


def _configure_logging(key: str, value: object) -> None:
    global _before_logging
    logger = logging.getLogger("fiberexec")
    if _before_logging is None:
        _before_logging = (logger.level, list(logger.handlers))
    if key == "debug":
        if value:
            logger.setLevel(logging.DEBUG)
    elif key == "log_level":
        level = value.upper() if isinstance(value, str) else value
        if not isinstance(level, int | str) or isinstance(level, bool):
            raise ConfigurationError(f"log_level is a logging level or one of debug, info, "
                                     f"warning, error, critical; got {value!r}")
        enable_logging(level)
    elif str(value).lower() == "stdout":
        enable_logging(logger.level or logging.INFO, stream=sys.stdout)
    else:
        path = str(value)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        handler = logging.FileHandler(f"{path}.{os.getpid()}", mode="w")  # one per process
        logger.addHandler(handler)
        logger.setLevel(logger.level or logging.INFO)


def reset() -> None:
    """Fiber's ``fiber.reset()``: the configuration this process had before `init` (and
    ``fiber.config.<key> = value``) changed it: each setting, and the ``fiberexec``
    logger's level and handlers (a ``log_file`` it opened is closed). Executors made
    before keep what they were made with."""
    global _before_logging
    for name, value in _before_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _before_env.clear()
    if _before_logging is not None:
        level, handlers = _before_logging
        logger = logging.getLogger("fiberexec")
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level)
        _before_logging = None


READABLE = frozenset({"backend", "image", "cpu_per_job", "mem_per_job", "log_level"})


def current() -> dict[str, object]:
    """Fiber's keys with the values an executor made now would use (``get_dict``)."""
    config = resolve({})
    memory = config.resources.memory
    return {
        "backend": config.backend,
        "image": config.image,
        "cpu_per_job": config.resources.cpu,
        "mem_per_job": memory // (1 << 20) if memory else None,
        "log_level": logging.getLogger("fiberexec").getEffectiveLevel(),
    }


class ConfigModule(ModuleType):
    """``fiberexec.config``, which also reads and sets Fiber's keys as attributes."""

    def __getattr__(self, name: str) -> Any:
        if name in READABLE:  # only these: the import system asks for others it may lack
            return current()[name]
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """A Fiber key sets it (`init`); so does a name that is neither the module's own
        nor private, which `init` refuses, listing Fiber's keys (a misspelt key is not
        kept silently)."""
        if name in KEYS or not (name.startswith("_") or name in self.__dict__):
            init(**{name: value})
        else:
            super().__setattr__(name, value)


def get_dict() -> dict[str, object]:
    """Fiber's ``fiber.config.get_dict()``: the current values of Fiber's keys."""
    return current()
