"""Optional backend capabilities the ``fiberexec`` command looks up by name.

A backend class may offer, as class methods (no instance, so no client or thread is made):

    launch_master(request: MasterRequest) -> int     ``fiberexec run``: run a program as the
                                                      master job; return its exit status
    probe() -> Probe                                  ``fiberexec info``: usable here, and why
    remove_stray(sweep: Sweep) -> list[str]          ``fiberexec cleanup``: remove the workers
                                                      a `Sweep` picks (by default those whose
                                                      executor's lease is gone); one line each

`Backend` defines all three to raise `CapabilityError`, which names the backend and the
capability, so a third-party backend that offers none still works with the executor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fiberexec._config import ENV_PREFIX
from fiberexec._errors import ConfigurationError

DEFAULT_SERVICE_ACCOUNT = "fiberexec-executor"  # docs/kubernetes-rbac.yaml
#: Label value and key that mark a master job (``fiberexec=master``).
MASTER_LABEL = "fiberexec.master"

_COMMANDS = {"launch_master": "fiberexec run", "probe": "fiberexec info",
             "remove_stray": "fiberexec cleanup"}


class CapabilityError(ConfigurationError):
    """A backend does not offer an optional capability (launch a master, probe, clean up)."""


def unsupported(backend: str, capability: str) -> CapabilityError:
    """The error a `Backend` default raises for ``capability``."""
    return CapabilityError(
        f"the {backend!r} backend does not support {_COMMANDS.get(capability, capability)} "
        f"(it does not implement Backend.{capability}); use a backend that does, or "
        f"implement {capability} on the backend class"
    )


@dataclass(frozen=True)
class MasterRequest:
    """What ``fiberexec run`` asks a backend's ``launch_master`` to do.

    ``namespace``, ``service_account`` and ``start_timeout`` are for backends with such
    notions (Kubernetes); ``keep`` keeps a container or pod after it exits.
    """

    command: tuple[str, ...]
    backend: str
    image: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # --env KEY=VALUE
    namespace: str | None = None
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    start_timeout: float = 300.0
    keep: bool = False

    def master_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The ``FIBEREXEC_*`` variables of ``environ``, the backend and image, then ``env``.

        The master's own `FiberExecutor` then starts workers on the same backend.
        """
        env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
        env[f"{ENV_PREFIX}BACKEND"] = self.backend
        if self.image:
            env[f"{ENV_PREFIX}IMAGE"] = self.image
        env.update(self.env)
        return env

    def require_image(self) -> str:
        """The image, or a `ConfigurationError` that says how to name one."""
        if not self.image:
            raise ConfigurationError(
                f"the {self.backend} backend needs an image with fiberexec and your code's "
                "dependencies; pass --image, set FIBEREXEC_IMAGE, or set image in the config "
                "file"
            )
        return self.image


@dataclass(frozen=True)
class Probe:
    """Whether a backend is usable on this machine, and the detail that says why (not)."""

    backend: str
    usable: bool
    detail: str


def first_line(exc: BaseException) -> str:
    """An exception's first line, for one-line reports."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def configured_backend_options(backend: str) -> dict[str, Any]:
    """The ``backend_options`` of the resolved configuration (arguments aside: environment,
    then config file), when the configuration is for ``backend``; else ``{}``.

    What ``fiberexec cleanup`` needs to reach a backend's hosts (ssh: ``hosts=``).
    """
    from fiberexec._config import resolve

    config = resolve()
    return dict(config.backend_options) if config.backend == backend else {}
