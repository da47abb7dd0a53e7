"""The Docker backend's capabilities for the ``fiberexec`` command: run a master, probe.

`docker_run_kwargs` is pure; `launch_master` and `probe` do the I/O through the docker SDK,
imported on first use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from fiberexec.backend import (
    LABEL_KEY,
    MASTER_LABEL,
    ConfigurationError,
    MasterRequest,
    PermanentBackendError,
    Probe,
    first_line,
)

ENGINE_HINT = (
    "start a Docker engine (`sudo systemctl start docker`, or run `dockerd`), or point "
    "DOCKER_HOST (or base_url= in backend_options) at one that is running"
)
DOCKER_SOCKET = "/var/run/docker.sock"
PING_TIMEOUT = 3.0  # seconds: an unreachable engine must not stall `fiberexec info`


def docker_run_kwargs(
    request: MasterRequest, cwd: str, environ: Mapping[str, str], *, local_engine: bool
) -> dict[str, Any]:
    """``containers.create`` arguments for the master container.

    Host networking (workers dial the master), the host's IPC namespace (shared memory with
    the workers), the working directory mounted at the same path (workers mount it the same
    way), and the engine's socket when it is local, so the master can start worker containers.
    """
    volumes = {cwd: {"bind": cwd, "mode": "rw"}}
    if local_engine:
        volumes[DOCKER_SOCKET] = {"bind": DOCKER_SOCKET, "mode": "rw"}
    return {
        "image": request.require_image(),
        "command": list(request.command),
        "environment": request.master_env(environ),
        "working_dir": cwd,
        "volumes": volumes,
        "network_mode": "host",
        "ipc_mode": "host",
        "init": True,
        "labels": {LABEL_KEY: "master", MASTER_LABEL: "docker"},
        "detach": True,
    }


def _sdk(what: str) -> Any:
    try:
        import docker
    except ImportError:
        raise ConfigurationError(
            f"{what} needs the docker SDK: pip install 'fiberexec[docker]'") from None
    return docker


def launch_master(request: MasterRequest) -> int:
    """Run the program in a container; stream its output; return its exit status."""
    request.require_image()
    docker = _sdk("fiberexec run --backend docker")
    found = probe()  # (within PING_TIMEOUT: an engine that does not answer is said at once)
    if not found.usable:
        raise PermanentBackendError(f"cannot run the program on Docker: {found.detail}; "
                                    f"{ENGINE_HINT}")
    client = docker.from_env(timeout=60)
    local_engine = str(client.api.base_url).startswith(("http+docker://localhost", "unix:"))
    kwargs = docker_run_kwargs(request, os.getcwd(), os.environ, local_engine=local_engine)
    container = client.containers.create(**kwargs)
    try:
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        return int(container.wait(timeout=60).get("StatusCode", 1))
    except KeyboardInterrupt:
        container.stop(timeout=10)
        return 130
    finally:
        if not request.keep:
            container.remove(force=True)
        client.close()


def probe(timeout: float = PING_TIMEOUT) -> Probe:
    """The SDK importable and the engine answering a ping within ``timeout`` seconds."""
    try:
        docker = _sdk("the docker backend")
    except ConfigurationError:
        return Probe("docker", False, "the docker SDK is missing: "
                                      "pip install 'fiberexec[docker]'")
    try:
        client = docker.from_env(timeout=timeout)
    except Exception as exc:  # DockerException for a bad DOCKER_HOST and similar
        return Probe("docker", False, f"no engine: {first_line(exc)}")
    try:
        client.ping()
        version = client.version().get("Version", "?")
        return Probe("docker", True, f"engine {version} at {client.api.base_url}")
    except Exception as exc:  # connection refused, timeout, permission denied on the socket
        return Probe("docker", False, f"engine at {client.api.base_url} not reachable: "
                                      f"{first_line(exc)}")
    finally:
        client.close()

