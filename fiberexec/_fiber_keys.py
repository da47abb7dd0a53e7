"""Uber Fiber's configuration keys, and where a program written for Fiber gives them.

Fiber reads its keys from ``fiber.init``/``fiber.config`` (`fiberexec._fiber`), from
``FIBER_<KEY>`` environment variables and from a ``.fiberconfig`` file in the current
directory (``configparser``, its ``[default]`` section). The keys that name a fiberexec
setting are taken from all three, so a program moved from Fiber with ``import fiberexec as
fiber`` runs where its deployment says, not silently on the local backend. `fiberexec._config`
reads the last two below fiberexec's own::

    argument > FIBEREXEC_<KEY> > FIBER_<KEY> > fiberexec's config file > .fiberconfig > default

(``fiber.init`` writes ``FIBEREXEC_<KEY>``: code over the environment, as in Fiber.)
"""

from __future__ import annotations

import configparser
from collections.abc import Callable, Mapping
from pathlib import Path

from fiberexec._errors import ConfigurationError

ENV_PREFIX = "FIBER_"
FILE_NAME = ".fiberconfig"
SECTION = "default"


def memory_mib(value: object) -> str:
    """Fiber's ``mem_per_job`` (MiB) as fiberexec's ``memory`` setting."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"mem_per_job is MiB per worker as a positive integer "
                                 f"(Fiber's unit), got {value!r}")
    return f"{value}Mi"


def _same(value: object) -> str:
    return str(value).strip()


# Fiber key -> (fiberexec setting, how its value is written for it). Of two keys for one
# setting, the first given wins, as Fiber's ``backend`` wins over its ``default_backend``.
SETTINGS: dict[str, tuple[str, Callable[[object], str]]] = {
    "backend": ("backend", _same),
    "default_backend": ("backend", _same),
    "image": ("image", _same),
    "default_image": ("image", _same),
    "cpu_per_job": ("cpu", _same),
    "mem_per_job": ("memory", memory_mib),
    "ipc_admin_master_port": ("ports", _same),
}
LOGGING = frozenset({"log_level", "log_file", "debug"})  # `fiber.init` sets the logger
# Fiber's own plumbing: accepted so its programs run, with no meaning here
IGNORED = frozenset({"ipc_active", "ipc_admin_worker_port", "merge_output", "use_bash",
                     "use_push_queue", "kubernetes_namespace"})
KEYS = frozenset(SETTINGS) | LOGGING | IGNORED

Given = tuple[str, str, str]  # (Fiber's key, its value as given, where it was given)


def unset(key: str, value: object) -> bool:
    """Whether ``value`` means "fiberexec's default" (Fiber's port 0: any port)."""
    return value is None or (key == "ipc_admin_master_port" and str(value).strip() == "0")


def written(key: str, value: str, where: str) -> str:
    """Fiber's ``key`` given ``value`` (``where``), as its fiberexec setting reads it.

    Raises:
        ConfigurationError: it cannot be, naming where it was given.
    """
    try:
        return SETTINGS[key][1](value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc} (from {where})") from None


def from_environment(environ: Mapping[str, str]) -> dict[str, Given]:
    """Each setting the ``FIBER_<KEY>`` variables give (an empty one gives none, as in
    Fiber)."""
    return _by_setting({key: (environ.get(ENV_PREFIX + key.upper(), ""),
                              f"environment variable {ENV_PREFIX}{key.upper()} (Fiber's)")
                        for key in SETTINGS})


def from_file(cwd: Path) -> dict[str, Given]:
    """Each setting the ``.fiberconfig`` file in ``cwd`` gives, if there is one.

    Raises:
        ConfigurationError: it cannot be read, or names a key Fiber does not have (Fiber
            refused those too).
    """
    path = cwd / FILE_NAME
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not a Fiber config file (configparser's "
                                 f"format, a [{SECTION}] section): {exc}") from None
    if not parser.has_section(SECTION):
        return {}
    section = parser[SECTION]
    unknown = sorted(set(section) - KEYS)
    if unknown:
        raise ConfigurationError(f"{path}: unknown key(s) {unknown} in [{SECTION}]; Fiber's "
                                 f"keys are {sorted(KEYS)}")
    where = f"{path} [{SECTION}] (Fiber's config file)"
    return _by_setting({key: (section.get(key, ""), where) for key in SETTINGS})


def _by_setting(values: Mapping[str, tuple[str, str]]) -> dict[str, Given]:
    found: dict[str, Given] = {}
    for key, (value, where) in values.items():
        setting = SETTINGS[key][0]
        if value.strip() and setting not in found and not unset(key, value):
            found[setting] = (key, value, where)
    return found
