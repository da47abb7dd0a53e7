"""``fiberexec info``: the resolved configuration, and which backends are usable here."""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fiberexec._config import ExecutorConfig, describe

PING_TIMEOUT = 3.0  # seconds: an unreachable engine must not stall `fiberexec info`
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Usability:
    backend: str
    usable: bool
    detail: str


def probe_local() -> Usability:
    return Usability("local", True, f"{platform.python_implementation()} "
                                    f"{platform.python_version()}, {os.cpu_count()} CPUs")


def probe_docker(timeout: float = PING_TIMEOUT) -> Usability:
    """The SDK importable and the engine answering a ping within ``timeout`` seconds."""
    if importlib.util.find_spec("docker") is None:
        return Usability("docker", False, "the docker SDK is missing: "
                                          "pip install 'fiberexec[docker]'")
    import docker

    try:
        client = docker.from_env(timeout=timeout)
    except Exception as exc:  # DockerException for a bad DOCKER_HOST and similar
        return Usability("docker", False, f"no engine: {_first_line(exc)}")
    try:
        client.ping()
        version = client.version().get("Version", "?")
        return Usability("docker", True, f"engine {version} at {client.api.base_url}")
    except Exception as exc:  # connection refused, timeout, permission denied on the socket
        return Usability("docker", False, f"engine at {client.api.base_url} not reachable: "
                                          f"{_first_line(exc)}")
    finally:
        client.close()


def probe_kubernetes() -> Usability:
    """The client importable and an in-cluster config or a kubeconfig context present."""
    if importlib.util.find_spec("kubernetes") is None:
        return Usability("kubernetes", False, "the kubernetes client is missing: "
                                              "pip install 'fiberexec[kubernetes]'")
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
        return Usability("kubernetes", True, "in-cluster service account")
    config: Any = importlib.import_module("kubernetes.config")
    try:
        _, active = config.list_kube_config_contexts()
    except (config.ConfigException, OSError) as exc:
        return Usability("kubernetes", False, f"no kubeconfig context: {_first_line(exc)}")
    name = (active or {}).get("name", "?")
    namespace = ((active or {}).get("context") or {}).get("namespace", "default")
    return Usability("kubernetes", True, f"context {name!r}, namespace {namespace!r} "
                                         "(the API server was not contacted)")


PROBES: dict[str, Callable[[], Usability]] = {
    "local": probe_local,
    "docker": probe_docker,
    "kubernetes": probe_kubernetes,
}


def probe_all(names: list[str]) -> list[Usability]:
    return [
        PROBES[n]() if n in PROBES else Usability(n, True, "registered by entry point")
        for n in names
    ]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def report(config: ExecutorConfig, usable: list[Usability], version: str) -> str:
    """What ``fiberexec info`` prints."""
    lines = [f"fiberexec {version} (Python {platform.python_version()})",
             f"config file: {config.config_file or 'none'}", "", "configuration:"]
    rows = describe(config)
    width = max(len(k) for k, _, _ in rows)
    lines += [f"  {k:<{width}}  {v:<24} ({source})" for k, v, source in rows]
    lines += ["", "backends:"]
    lines += [f"  {u.backend:<11} {'usable' if u.usable else 'unusable':<9} {u.detail}"
              for u in usable]
    return "\n".join(lines)


def as_json(config: ExecutorConfig, usable: list[Usability]) -> dict[str, object]:
    return {
        "config_file": config.config_file,
        "configuration": {k: {"value": v, "source": s} for k, v, s in describe(config)},
        "backends": {u.backend: {"usable": u.usable, "detail": u.detail} for u in usable},
    }
