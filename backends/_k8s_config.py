"""Where the Kubernetes backend finds its cluster: client, namespace, own address."""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
from typing import Any

from fiberexec.backend import ConfigurationError

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_INSTALL_HINT = "pip install 'fiberexec[kubernetes]'"


def _kube(module: str) -> Any:
    """A ``kubernetes`` submodule, imported on first use (the package is an optional extra)."""
    return importlib.import_module(f"kubernetes.{module}")


def make_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient from in-cluster config, else from kubeconfig (file and context)."""
    client, config = _kube("client"), _kube("config")
    try:
        if kubeconfig is None and context is None and in_cluster():
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except config.ConfigException as exc:
        raise ConfigurationError(
            f"no usable Kubernetes configuration ({exc}); pass kubeconfig=, context= or "
            "api_client= to KubernetesBackend, or run inside a cluster") from exc


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The in-cluster namespace, else the kubeconfig context's namespace, else "default"."""
    path = os.path.join(_SA_DIR, "namespace")
    if kubeconfig is None and context is None and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    config = _kube("config")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def require_client() -> None:
    if importlib.util.find_spec("kubernetes") is None:
        raise ConfigurationError(f"the kubernetes backend needs the kubernetes client; "
                                 f"{_INSTALL_HINT}")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        os.path.join(_SA_DIR, "token"))


def own_address() -> str:
    if os.environ.get("POD_IP"):
        return os.environ["POD_IP"]
    try:
        return socket.gethostbyname(socket.gethostname())  # /etc/hosts in a pod: no DNS query
    except OSError:
        return "127.0.0.1"


def loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"
