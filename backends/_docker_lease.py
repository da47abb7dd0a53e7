"""An executor's lease on a Docker engine: a container that lives exactly as long as we do.

    acquire():  create fiberexec-lease-<executor> (labels fiberexec=lease, executor) running
                ``python -c 'read stdin to its end'`` with stdin open; attach to its stdin;
                start it.  The engine closes the container's stdin when our attach
                connection closes (StdinOnce), which the kernel does when this process ends
                however it ends (SIGKILL too): the container exits and is auto-removed.
    held():     the executors whose lease container runs: what ``fiberexec cleanup`` tests,
                from any process that can reach the engine.
    release():  remove the container (with the executor's last worker container, or close()).

A container's labels cannot change once it exists, so no timestamp is renewed: the lease's
liveness is the engine's own record of a connection, with no clock and no renewal thread.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from fiberexec.backend import EXECUTOR_LABEL, LABEL_KEY, lease_name

LEASE_VALUE = "lease"  # fiberexec=lease marks a lease container
_READ_STDIN = "import sys; sys.stdin.buffer.read()"


class DockerLease:
    """The one lease of one executor's workers on one engine (thread-safe, idempotent)."""

    def __init__(self, api: Any, executor_id: str) -> None:
        self.api = api
        self.executor_id = executor_id
        self.name = lease_name(executor_id)
        self._lock = threading.Lock()
        self._ref: str | None = None
        self._stdin: Any = None

    def acquire(self, image: str, python: str) -> None:
        """Hold the lease, creating its container on the first call; the caller translates
        engine errors."""
        with self._lock:
            if self._ref is not None:
                return
            config = self.api.create_host_config(auto_remove=True, network_mode="none")
            created = self.api.create_container(
                image, [python, "-c", _READ_STDIN], name=self.name, stdin_open=True,
                labels={LABEL_KEY: LEASE_VALUE, EXECUTOR_LABEL: self.executor_id},
                host_config=config)
            ref = str(created["Id"])
            try:
                self._stdin = self.api.attach_socket(ref, params={"stdin": 1, "stream": 1})
                self.api.start(ref)
            except BaseException:
                self._close_stdin()
                with contextlib.suppress(Exception):
                    self.api.remove_container(ref, force=True)
                raise
            self._ref = ref

    def release(self) -> None:
        """Give the lease up: its container goes; quiet if it is gone already."""
        with self._lock:
            ref, self._ref = self._ref, None
            self._close_stdin()
        if ref is not None:  # removed (and waited for: its name may be taken again at once)
            with contextlib.suppress(Exception):  # gone, or auto-removal already under way
                self.api.remove_container(ref, force=True)
            with contextlib.suppress(Exception):  # gone already: the lease is released
                self.api.wait(ref, condition="removed", timeout=30)

    def _close_stdin(self) -> None:
        stdin, self._stdin = self._stdin, None
        if stdin is not None:  # a SocketIO over the connection: close the socket itself
            with contextlib.suppress(OSError):
                getattr(stdin, "_sock", stdin).close()
            with contextlib.suppress(OSError):
                stdin.close()


def held(api: Any) -> set[str]:
    """Executor ids whose lease container runs on this engine."""
    found = api.containers(filters={"label": f"{LABEL_KEY}={LEASE_VALUE}",
                                    "status": "running"})
    return {c["Labels"].get(EXECUTOR_LABEL, "") for c in found}
