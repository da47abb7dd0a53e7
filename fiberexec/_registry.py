"""Find backends by name through the ``fiberexec.backends`` entry-point group.

The core never imports a concrete backend: it resolves a name to a class here, lazily.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Mapping
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
    return dict(_scanned())


def _target(name: str) -> str | None:
    """Where the backend ``name`` lives; a built-in name needs no scan (a first ``submit``
    would spend 5-15 ms reading every installed distribution's metadata)."""
    return _BUILTIN.get(name) or _targets().get(name)


@functools.cache
def _scanned() -> dict[str, str]:
    """Built-in names and the entry points installed, read once per process (a scan of the
    installed distributions costs tens of milliseconds). A built-in name stays built in:
    an entry point of another distribution cannot take it over."""
    from importlib.metadata import entry_points  # (15 ms to import: only for a scan)

    targets = dict(_BUILTIN)
    for ep in entry_points(group=GROUP):
        targets.setdefault(ep.name, ep.value)
    return targets


def available_backends() -> list[str]:
    """The names `load_backend` accepts, sorted."""
    return sorted(_targets())


def check_backend_name(name: str, source: str) -> None:
    """Refuse a name no backend is registered under, without importing any backend.

    Args:
        source: where the name came from, for the message ("the backend= argument", ...).

    Raises:
        ConfigurationError: the name is unknown; the message suggests the closest known name
            and lists them all.
    """
    if _target(name) is None:
        raise unknown_backend(name, source)


def unknown_backend(name: str, source: str) -> ConfigurationError:
    """The one error for a backend name nothing is registered under."""
    names = available_backends()
    folded = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.strip().lower(), list(folded), n=1)
    hint = f"did you mean {folded[close[0]]!r}? " if close else ""
    return ConfigurationError(
        f"unknown backend {name!r} (from {source}); {hint}known backends: {', '.join(names)} "
        f"(or register a Backend subclass under the {GROUP!r} entry-point group)"
    )


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``, imported but not instantiated.

    Raises:
        ConfigurationError: no backend has that name (the message lists the choices).
        ImportError: the backend's module or an optional dependency it imports is missing.
    """
    target = _target(name)
    if target is None:
        raise unknown_backend(name, "the backend name asked for")
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigurationError(f"entry point {name!r} -> {target} is not a Backend subclass")
    return cls


def load_backend(name: str, **options: Any) -> Backend:
    """Instantiate the backend registered as ``name`` with ``options``.

    Raises:
        ConfigurationError: no backend has that name (the message lists the choices), or
            it takes no option of a name in ``options`` (the ``backend_options`` setting).
    """
    cls = backend_class(name)
    _check_options(name, cls, options)
    backend: Backend = cls(**options)
    return backend


def _check_options(name: str, cls: type, options: Mapping[str, Any]) -> None:
    """Each of ``options`` names a keyword argument of ``cls`` (unless it takes any)."""
    import inspect

    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = sorted(n for n, p in parameters.items()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    for key in options:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigurationError(
                f"backend_options has {key!r}, which the {name!r} backend does not take; "
                f"{guess}it takes {', '.join(accepted) or 'no options'}")
