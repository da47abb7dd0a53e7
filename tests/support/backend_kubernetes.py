"""Test support for the Kubernetes backend: the API emulator on loopback, pods as processes."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fiberexec.backend import Backend, Sweep, lease_name
from fiberexec.testing import Harness
from tests.k8s.emulator import Emulator
from tests.support.kit import BackendKit

NAMESPACE = "fiberexec-test"
IMAGE = "fiberexec-test:latest"


@contextlib.contextmanager
def backend_session() -> Iterator[BackendKit]:
    """Serve the emulator for the whole session; stop it (killing every pod process) after."""
    from kubernetes.client import CoordinationV1Api

    from fiberexec.backends.kubernetes import KubernetesBackend, remove_stray

    with Emulator(namespaces=[NAMESPACE]) as emu:
        client = emu.api_client()  # shared: backends never close a client they were given

        def make_backend() -> Backend:
            return KubernetesBackend(api_client=client, namespace=NAMESPACE, image=IMAGE,
                                     advertise_host="127.0.0.1")

        def remove(_: Backend, sweep: Sweep) -> object:
            return remove_stray(client, namespace=NAMESPACE, sweep=sweep)

        def abandon(_: Backend, executor_id: str) -> None:  # as if its renewals had stopped
            CoordinationV1Api(client).delete_namespaced_lease(lease_name(executor_id),
                                                              NAMESPACE)

        # Memory limits are not enforced by the emulator (its OOM is injected: see
        # tests/k8s), so the contract's OOM check does not apply here.
        contract = Harness(make_backend=make_backend, remove_stray=remove, abandon=abandon)
        with tempfile.TemporaryDirectory() as home:
            kubeconfig = _kubeconfig(Path(home), emu.url)
            options = {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE,
                       "advertise_host": "127.0.0.1"}
            settings = {"FIBEREXEC_BACKEND": "kubernetes", "FIBEREXEC_IMAGE": IMAGE,
                        "FIBEREXEC_BACKEND_OPTIONS": json.dumps(options)}
            try:
                yield BackendKit(name="kubernetes", make_backend=make_backend,
                                 leaks=lambda: leaks(emu), contract=contract, executor_kwargs={},
                                 settings=settings)
            finally:
                client.close()


def _kubeconfig(folder: Path, url: str) -> Path:
    """A kubeconfig naming the emulator (plain HTTP, no credentials), as a user's would."""
    path = folder / "kubeconfig"
    path.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator",
                                                      "user": "emulator"}}],
    }))
    return path


def leaks(emu: Emulator) -> list[str]:
    """Pods and Secrets labelled ``fiberexec`` still stored, and pod processes still alive."""
    found = [f"pod {p['metadata']['namespace']}/{p['metadata']['name']} "
             f"({(p.get('status') or {}).get('phase')})" for p in emu.pods(selector="fiberexec")]
    found += [f"secret {s['metadata']['namespace']}/{s['metadata']['name']}"
              for s in emu.secrets(selector="fiberexec")]
    found += [f"lease {n}/{name}" for (resource, n, name) in emu.store.objects()
              if resource == "leases"]
    emu.kubelet.settle(timeout=10)  # pods deleted a moment ago may still be terminating
    return found + emu.running_processes()
