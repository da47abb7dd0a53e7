"""An executor's lease on a Kubernetes cluster: a ``coordination.k8s.io/v1`` Lease it renews.

    acquire():  create Lease fiberexec-lease-<executor> (labels fiberexec=lease, executor;
                holderIdentity, leaseDurationSeconds, renewTime), then renew its renewTime
                every duration/3 seconds on a thread of its own
    held():     executors whose Lease was renewed within its duration: what ``fiberexec
                cleanup`` tests, from any machine that can list leases in the namespace
    release():  stop renewing and delete the Lease (our close())

A killed executor stops renewing, so its Lease lapses ``duration`` seconds later (judged by
the clock of the machine that runs ``cleanup``: keep the duration well above the clock skew
between machines). A renewal that fails is retried at the next period; only a Lease left
unrenewed for a whole duration lets ``cleanup`` take its workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fiberexec.backend import EXECUTOR_LABEL, LABEL_KEY, lease_name

log = logging.getLogger("fiberexec.backends.kubernetes")
Json = dict[str, Any]
LEASE_VALUE = "lease"
DEFAULT_DURATION = 30.0  # seconds a Lease holds without renewal


def micro_time(at: float) -> str:
    """A Kubernetes MicroTime: ``2006-01-02T15:04:05.000000Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str) -> float | None:
    """An RFC 3339 time (``Z`` or an offset, as clients and servers write MicroTimes)."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


class KubeLease:
    """One executor's Lease in one namespace; ``call(verb, fn, *args)`` runs one API call
    (translated and retried by the backend)."""

    def __init__(self, api: Any, namespace: str, executor_id: str, *, duration: float,
                 call: Callable[..., Any],
                 owners: list[Json], clock: Callable[[], float] = time.time) -> None:
        self.api, self.namespace, self.executor_id = api, namespace, executor_id
        self.name = lease_name(executor_id)
        self.duration = max(1, round(duration))
        self._call, self._owners, self._clock = call, owners, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def body(self) -> Json:
        now = micro_time(self._clock())
        meta: Json = {"name": self.name,
                      "labels": {LABEL_KEY: LEASE_VALUE, EXECUTOR_LABEL: self.executor_id}}
        if self._owners:
            meta["ownerReferences"] = self._owners
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.executor_id, "acquireTime": now,
                         "renewTime": now, "leaseDurationSeconds": self.duration}}

    def acquire(self) -> None:
        """Create the Lease and start renewing it (once; a second call does nothing)."""
        if self._thread is not None:
            return
        self._call("create", self.api.create_namespaced_lease, self.namespace, self.body())
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name="fiberexec-k8s-lease")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                self.renew()
            except Exception as exc:  # gone (deleted by hand, or by a backend letting go of
                # it as this one took it): made again; else the next period tries again
                log.warning("could not renew Lease %s in namespace %s: %s; creating it again",
                            self.name, self.namespace, exc)
                with contextlib.suppress(Exception):
                    self._call("create", self.api.create_namespaced_lease, self.namespace,
                               self.body())

    def renew(self) -> None:
        patch = {"spec": {"renewTime": micro_time(self._clock())}}
        self._call("patch", self.api.patch_namespaced_lease, self.name, self.namespace, patch)

    def release(self, delete: Callable[[str], None]) -> None:
        """Stop renewing; ``delete(name)`` removes the Lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            delete(self.name)


def held(leases: list[Json], now: float) -> set[str]:
    """Executor ids whose Lease (from a list response's items) was renewed in time."""
    live = set()
    for lease in leases:
        spec = lease.get("spec") or {}
        renewed = _parse_time(str(spec.get("renewTime") or ""))
        duration = spec.get("leaseDurationSeconds") or 0
        if renewed is not None and renewed + float(duration) >= now:
            live.add((lease.get("metadata", {}).get("labels") or {}).get(EXECUTOR_LABEL, ""))
    return live


def list_items(resp: Any) -> list[Json]:
    items: list[Json] = json.loads(resp.data).get("items") or []
    return items
