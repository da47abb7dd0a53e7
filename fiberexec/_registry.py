"""Find backends by name through the ``fiberexec.backends`` entry-point group.

The core never imports a concrete backend: it resolves a name to a class here, lazily.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from fiberexec._backend import Backend
from fiberexec._errors import ConfigurationError

GROUP = "fiberexec.backends"
# Used when the distribution's metadata is absent (running from a source tree).
_BUILTIN = {
    "local": "fiberexec.backends.local:LocalBackend",
    "docker": "fiberexec.backends.docker:DockerBackend",
    "kubernetes": "fiberexec.backends.kubernetes:KubernetesBackend",
    "slurm": "fiberexec.backends.slurm:SlurmBackend",
    "ssh": "fiberexec.backends.ssh:SSHBackend",
}


def _targets() -> dict[str, str]:
    targets = dict(_BUILTIN)
    for ep in entry_points(group=GROUP):
        targets[ep.name] = ep.value
    return targets


def available_backends() -> list[str]:
    """The names `load_backend` accepts, sorted."""
    return sorted(_targets())


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``, imported but not instantiated.

    Raises:
        ConfigurationError: no backend has that name (the message lists the choices).
        ImportError: the backend's module or an optional dependency it imports is missing.
    """
    target = _targets().get(name)
    if target is None:
        raise ConfigurationError(
            f"unknown backend {name!r}; choose one of {available_backends()} "
            f"or register one under the {GROUP!r} entry-point group"
        )
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigurationError(f"entry point {name!r} -> {target} is not a Backend subclass")
    return cls


def load_backend(name: str, **options: Any) -> Backend:
    """Instantiate the backend registered as ``name`` with ``options``.

    Raises:
        ConfigurationError: no backend has that name (the message lists the choices).
    """
    backend: Backend = backend_class(name)(**options)
    return backend
