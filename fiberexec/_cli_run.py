"""``fiberexec run``: launch a program as the master job through its backend's `launch_master`.

The program's own `FiberExecutor` then starts workers on the same backend: the request's
`MasterRequest.master_env` sets ``FIBEREXEC_BACKEND`` (and ``FIBEREXEC_IMAGE``) and passes
every other ``FIBEREXEC_*`` variable on. How the master runs (a child process, a container, a
pod) is the backend's business; this module only finds the backend and maps the exit status.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from fiberexec.backend import (
    ConfigurationError,
    MasterRequest,
    backend_class,
    check_backend_name,
)


def exit_status(code: int) -> int:
    """A shell's exit status for a child's return code (signal N -> 128 + N)."""
    return 128 - code if code < 0 else code


def run(request: MasterRequest) -> int:
    """Launch ``request`` on its backend; return the shell exit status of the program."""
    if not request.command:
        raise ConfigurationError(
            "no program given; name it after --, e.g. fiberexec run -- python train.py")
    check_backend_name(request.backend, "the --backend option")
    try:
        backend = backend_class(request.backend)
    except ImportError as exc:
        raise ConfigurationError(f"cannot load the {request.backend} backend: {exc}") from None
    if backend.shares_python:
        request = dataclasses.replace(request, command=with_our_python(request.command))
    return exit_status(backend.launch_master(request))


#: Program names ``fiberexec run`` reads as "the interpreter fiberexec is installed in".
PYTHON_NAMES = ("python", "python3")


def with_our_python(command: Sequence[str]) -> tuple[str, ...]:
    """``command`` with a leading ``python`` or ``python3`` replaced by `sys.executable`.

    The ``python`` first on PATH may be another interpreter, without fiberexec or the
    program's dependencies; the one running this command has fiberexec.
    """
    if command[:1] and command[0] in PYTHON_NAMES and sys.executable:
        return (sys.executable, *command[1:])
    return tuple(command)


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--env must be KEY=VALUE, got {pair!r}")
        env[key] = value
    return env
