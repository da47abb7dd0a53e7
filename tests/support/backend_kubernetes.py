"""Test support for the Kubernetes backend: the API emulator on loopback, pods as processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
        try:
            yield BackendKit(name="kubernetes", make_backend=make_backend,
                             leaks=lambda: leaks(emu), contract=contract, executor_kwargs={})
        finally:
            client.close()


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
