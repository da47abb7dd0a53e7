"""Workers as Kubernetes pods, on the official ``kubernetes`` client.

    start_worker ──> Lease (once, renewed: the executor's liveness, `_k8s_lease`)
                 ──> Secret (once, holds secret_env) ──> Pod (restartPolicy Never)
    PodWatcher: ONE list+watch on ``fiberexec.executor=<id>`` ──> cache ──> status(), watch()
    Deadlines: a pod Pending past ``pending_deadline`` ──> FAILED with the pod's own reason
    Image pull refused (no such image or tag, access denied) ──> FAILED at once, in the
    kubelet's words; transient pull errors (timeouts, rate limits) wait for the deadline
    close(): delete pods, wait for the watch to see them gone, delete the Secret

`status` reads the watch cache, so it costs no API call. Errors are translated in
`fiberexec.backends._k8s_errors`; API calls other than pod creation (which the executor
retries) go through a `RetryPolicy`. See ``docs/kubernetes-rbac.yaml`` for the permissions.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from fiberexec.backend import (
    EXECUTOR_LABEL,
    LABEL_KEY,
    LEASE_LABEL,
    WORKER_LABEL,
    Backend,
    ConfigurationError,
    ExitListener,
    ExitWatch,
    MasterRequest,
    PermanentBackendError,
    Probe,
    RetryPolicy,
    Sweep,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)
from fiberexec.backends import _k8s_master
from fiberexec.backends._k8s_config import (
    default_namespace,
    in_cluster,
    loopback,
    make_api_client,
    own_address,
    require_client,
)
from fiberexec.backends._k8s_errors import ApiStatus, api_errors
from fiberexec.backends._k8s_lease import DEFAULT_DURATION, KubeLease, list_items
from fiberexec.backends._k8s_lease import held as held_leases
from fiberexec.backends._k8s_pods import (
    build_pod,
    build_secret,
    deleted_status,
    dns_label,
    owner_reference,
    pull_error,
    worker_status,
)
from fiberexec.backends._k8s_watch import Deadlines, PodWatcher

__all__ = ["KubernetesBackend", "remove_stray"]

log = logging.getLogger("fiberexec.backends.kubernetes")
Json = dict[str, Any]
SIGTERM_GRACE = 2  # seconds between SIGTERM and SIGKILL when a worker is signalled
#: The API server calls a container "ContainerCreating" until the kubelet's next status sync,
#: up to about a second after the container started (it may already run and print): its logs
#: are asked for again over that window before "nothing yet" is the answer.
_LOGS_SETTLE = RetryPolicy(attempts=12, deadline=3.0, initial=0.05, maximum=0.5, jitter=0.05)


class _StillCreating(TransientBackendError):
    """The pod's container is reported as being created: its logs may come a moment later."""


class KubernetesBackend(Backend):
    """Run each worker as a Pod in one namespace.

    Args:
        namespace: where pods go (default: the in-cluster namespace, else the kubeconfig
            context's namespace, else ``"default"``).
        image: the worker image, unless a `WorkerSpec` names one.
        kubeconfig, context: which cluster to talk to (default: in-cluster config, else
            ``~/.kube/config``); or pass a ready ``api_client`` (``kubernetes.client.ApiClient``).
        pod_template: dict deep-merged into every pod (nodeSelector, tolerations,
            serviceAccountName, imagePullSecrets, volumes; a container named ``"worker"`` merges
            into the worker container).
        advertise_host, bind_host: the address workers dial and the one the executor binds
            (default: ``POD_IP``/this pod's address in a cluster, else 127.0.0.1).
        pending_deadline: seconds a pod may stay Pending before it is reported FAILED. A pod
            whose image the registry refuses (no such image or tag, access denied) fails as
            soon as the kubelet reports it, without waiting for the deadline.
        owner_pod: the executor's own pod, made owner of every worker pod and the Secret so
            they are garbage-collected with it (default: ``HOSTNAME`` in a cluster; ``""``: none).
        retry: policy for API calls other than pod creation.
        lease_duration: seconds the executor's ``coordination.k8s.io`` Lease holds without
            renewal (it is renewed every third of it); ``fiberexec cleanup`` removes the pods
            of an executor whose Lease lapsed, so keep it above the clock skew between
            machines.

    Raises:
        ConfigurationError: a bad option, or the ``kubernetes`` package missing.

    Example:
        >>> backend = KubernetesBackend(namespace="ml", image="me/es:1")  # doctest: +SKIP
        >>> FiberExecutor(64, backend=backend)  # doctest: +SKIP
    """

    name = "kubernetes"
    enforces_resources = True
    resource_limits: ClassVar[Mapping[str, str]] = {
        "cpu": "the pod's cpu request and limit",
        "memory": "the pod's memory request and limit",
        "gpu": "the pod's nvidia.com/gpu request and limit",
    }

    def __init__(self, *, namespace: str | None = None, image: str | None = None,
                 kubeconfig: str | None = None, context: str | None = None,
                 api_client: Any = None, pod_template: Mapping[str, Any] | None = None,
                 advertise_host: str | None = None, bind_host: str | None = None,
                 pending_deadline: float = 300.0, owner_pod: str | None = None,
                 retry: RetryPolicy | None = None, request_timeout: float = 30.0,
                 close_timeout: float = 30.0, lease_duration: float = DEFAULT_DURATION,
                 clock: Callable[[], float] = time.monotonic) -> None:
        require_client()
        _check_options(api_client, kubeconfig, context, pod_template, pending_deadline)
        if lease_duration < 1:
            raise ConfigurationError(f"lease_duration must be >= 1 second, got {lease_duration}")
        inside = in_cluster()
        self.advertise_host = advertise_host or (own_address() if inside else "127.0.0.1")
        self.bind_host = bind_host or ("127.0.0.1" if loopback(self.advertise_host)
                                       else "0.0.0.0")  # workers dial in from other pods
        self.image = image
        self.pod_template = dict(pod_template or {})
        self.pending_deadline = pending_deadline
        self.request_timeout = request_timeout
        self.close_timeout = close_timeout
        self.owner_pod = owner_pod if owner_pod is not None else (
            os.environ.get("HOSTNAME", "") if inside else "")
        self._owner_auto = owner_pod is None
        self._namespace = namespace
        self._kubeconfig, self._context = kubeconfig, context
        self._client, self._owns_client = api_client, api_client is None
        self._retry = retry or RetryPolicy(attempts=6, deadline=60.0)
        self._clock = clock
        self._lock = threading.RLock()
        self._core_api: Any = None
        self._owners: list[Json] | None = None
        self._executor_id: str | None = None
        self._secret: tuple[str, dict[str, str]] | None = None
        self._watcher: PodWatcher | None = None
        self._exit_watch = ExitWatch(key=lambda handle: handle.ref)  # the watch names pods
        self._deadlines = Deadlines(self._deadline_passed, clock)
        self._workers: dict[str, tuple[WorkerHandle, float]] = {}  # pod name -> handle, start
        self._pull_errors: dict[str, str] = {}  # pod name -> its last ErrImagePull message
        self._closed = False
        self.lease_duration = lease_duration
        self._lease: KubeLease | None = None

    # -- the seam --------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        if self._namespace is None:
            self._namespace = default_namespace(self._kubeconfig, self._context)
        return self._namespace

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        image = spec.image or self.image
        if not image:
            raise ConfigurationError("kubernetes workers need an image, got none; pass "
                                     "image= to KubernetesBackend or FiberExecutor")
        core = self._core()
        name = dns_label("fiberexec", spec.executor_id[:12], spec.worker_id)
        with self._lock:  # the watch and the Secret exist while a worker is registered
            if self._closed:
                raise PermanentBackendError("start_worker after close(); create a new backend")
            watcher = self._ensure_watch(spec.executor_id)
            lease = self._ensure_lease(spec.executor_id)
            secret_name = self._ensure_secret(spec)
            pod = build_pod(spec, name=name, image=image, secret_name=secret_name,
                            template=self.pod_template, owners=self._owner_refs())
            pod["metadata"]["labels"][LEASE_LABEL] = lease.name
            self._workers[name] = (WorkerHandle(spec.worker_id, name), self._clock())
        try:
            created = self._create_pod(core, pod, spec.executor_id)
        except BaseException:
            self._forget(name)
            raise
        watcher.seed(created)
        self._deadlines.add(name, self._clock() + self.pending_deadline)
        return WorkerHandle(spec.worker_id, name)

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        with self._lock:
            entry, watcher = self._workers.get(handle.ref), self._watcher
            last_pull_error = self._pull_errors.get(handle.ref)
        if entry is None or watcher is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
        pod, deleted = watcher.lookup(handle.ref)
        if deleted:
            return deleted_status(pod)
        if pod is None:
            return WorkerStatus(WorkerState.PENDING)
        return worker_status(pod, pending_for=self._clock() - entry[1],
                             pending_deadline=self.pending_deadline,
                             last_pull_error=last_pull_error)

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        """Report ``handle``'s end from the shared pod watch (no thread or request per pod)."""
        self._exit_watch.watch(handle, listener)
        self._check([handle.ref])  # it may have finished before we were asked

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        """Delete the pod (``grace`` rounded up to whole seconds, at least 1) and forget it.

        Stopping the last worker also removes the Secret and ends the watch (after the pods
        are gone), so an executor that stops all its workers leaves nothing behind even if
        nobody calls `close`; the next `start_worker` sets them up again.
        """
        self.unwatch(handle)
        with self._lock:
            known = handle.ref in self._workers
            watcher = self._watcher
        if watcher is not None:
            watcher.forget(handle.ref)
        if known:
            self._delete_pod(handle.ref, grace)
        self._forget(handle.ref)

    def signal(self, handle: WorkerHandle, sig: int) -> None:
        """SIGTERM or SIGKILL, delivered the only way the API offers: deleting the pod.

        SIGTERM deletes it with a grace period of `SIGTERM_GRACE` seconds (the kubelet sends
        SIGTERM, then SIGKILL); SIGKILL deletes it with none. The exit is reported by the
        watch as usual. Other signals would need ``pods/exec``, so they raise.
        """
        if sig not in (signal.SIGTERM, signal.SIGKILL):
            super().signal(handle, sig)
        with self._lock:
            known = handle.ref in self._workers
        if known:
            _delete(self._retry, "pods", self.namespace, self._core().delete_namespaced_pod,
                    handle.ref, timeout=self.request_timeout,
                    grace_period_seconds=SIGTERM_GRACE if sig == signal.SIGTERM else 0)

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        core = self._core()

        def read() -> str:
            try:
                resp = self._retry.call(lambda: _call(
                    "get", "pods/log", self.namespace, core.read_namespaced_pod_log,
                    handle.ref, self.namespace, container="worker", tail_lines=tail,
                    passthrough=frozenset({400, 404}), _preload_content=False,
                    _request_timeout=self.request_timeout))
            except ApiStatus as exc:  # not started yet, or gone: nothing kept
                if exc.code == 400 and "ContainerCreating" in exc.message:
                    raise _StillCreating(exc.message) from exc
                return ""
            return bytes(resp.data).decode("utf-8", errors="replace")

        try:
            return _LOGS_SETTLE.call(read)
        except _StillCreating:
            return ""

    def close(self) -> None:
        """Delete every pod of this backend and its Secret; stop the watch. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            names = set(self._workers)
            self._workers.clear()
            parts = self._detach()
        self._exit_watch.clear()  # every pod is deleted below: none is reported
        if parts is not None:
            self._release(*parts, delete=names)
        self._deadlines.stop()
        if self._owns_client and self._client is not None:
            self._client.close()

    # -- capabilities of the ``fiberexec`` command -------------------------------------------
    @classmethod
    def launch_master(cls, request: MasterRequest) -> int:
        """Run the program as a Pod (``_k8s_master``); stream its logs; its exit code."""
        return _k8s_master.launch_master(request)

    @classmethod
    def probe(cls) -> Probe:
        return _k8s_master.probe()

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """Delete the worker pods ``sweep`` picks (this module's `remove_stray`)."""
        return remove_stray(namespace=sweep.namespace, sweep=sweep) or ["no stray workers"]

    # -- pods ------------------------------------------------------------------------------
    def _create_pod(self, core: Any, pod: Json, executor_id: str) -> Json:
        name = pod["metadata"]["name"]
        try:
            with api_errors("create", "pods", self.namespace, passthrough=frozenset({409})):
                resp = core.create_namespaced_pod(self.namespace, pod, _preload_content=False,
                                                  _request_timeout=self.request_timeout)
            created: Json = json.loads(resp.data)
            return created
        except ApiStatus:  # AlreadyExists: an earlier attempt of this call got through
            existing = self._read_pod(name)
            labels = existing.get("metadata", {}).get("labels") or {}
            if labels.get(EXECUTOR_LABEL) != executor_id:
                raise PermanentBackendError(
                    f'pod "{name}" already exists in namespace "{self.namespace}" and is not '
                    "this executor's; delete it or run fiberexec.backends.kubernetes."
                    "remove_stray()") from None
            return existing

    def _read_pod(self, name: str, passthrough: frozenset[int] = frozenset()) -> Json:
        core = self._core()
        resp = self._retry.call(lambda: _call(
            "get", "pods", self.namespace, core.read_namespaced_pod, name, self.namespace,
            passthrough=passthrough, _preload_content=False,
            _request_timeout=self.request_timeout))
        pod: Json = json.loads(resp.data)
        return pod

    def _delete_pod(self, name: str, grace: float) -> None:
        _delete(self._retry, "pods", self.namespace, self._core().delete_namespaced_pod, name,
                grace_period_seconds=max(1, math.ceil(grace)), timeout=self.request_timeout)

    def _forget(self, name: str) -> None:
        """Drop a worker; if it was the last one, release the watch and the Secret."""
        self._deadlines.cancel(name)
        with self._lock:
            self._workers.pop(name, None)
            self._pull_errors.pop(name, None)
            parts = self._detach() if not self._workers and not self._closed else None
        if parts is not None:
            self._release(*parts, delete=set())

    def _detach(self) -> tuple[PodWatcher, str | None, KubeLease | None] | None:
        """Take the watch, the Secret and the Lease out of service (under ``_lock``)."""
        if self._watcher is None:
            return None
        parts = (self._watcher, self._secret[0] if self._secret else None, self._lease)
        self._watcher, self._secret, self._lease = None, None, None
        return parts

    def _release(self, watcher: PodWatcher, secret: str | None, lease: KubeLease | None, *,
                 delete: set[str]) -> None:
        """Delete ``delete`` and any other live pod, wait until the watch sees them gone;
        then the Secret, and last the Lease (no pod may look like a stray meanwhile)."""
        live = watcher.live_names()
        for name in sorted(delete | live):
            try:
                self._delete_pod(name, 1.0)
            except Exception as exc:  # cleanup goes on: a leak is reported, not raised
                log.warning("could not delete pod %s: %s; run remove_stray() to clean up",
                            name, exc)
        left = watcher.wait_gone(delete | live, timeout=self.close_timeout)
        if left:
            log.warning("pods %s still terminating after %.0fs in namespace %s",
                        sorted(left), self.close_timeout, self.namespace)
        watcher.stop()
        if secret is not None:
            self._delete_secret(secret)
        if lease is not None:
            lease.release(self._delete_lease)

    # -- the watch -------------------------------------------------------------------------
    def _ensure_watch(self, executor_id: str) -> PodWatcher:
        """The one pod watch, on this executor's label (under ``_lock``)."""
        if self._executor_id is None:
            self._executor_id = executor_id
        elif executor_id != self._executor_id:
            raise ConfigurationError(
                f"one KubernetesBackend serves one executor, got executor id "
                f"{executor_id!r} after {self._executor_id!r}; create a backend per executor")
        if self._watcher is None:
            self._watcher = PodWatcher(
                self._core(), self.namespace, f"{EXECUTOR_LABEL}={executor_id}",
                on_change=self._check, wanted=self._tracked,
                request_timeout=self.request_timeout)
            self._watcher.start()
        return self._watcher

    def _tracked(self, name: str) -> bool:
        with self._lock:
            return name in self._workers

    def _check(self, names: list[str]) -> None:
        """Report every watched worker among ``names`` that has finished."""
        for name in names:
            self._note_pull_error(name)
            handle = self._exit_watch.get(name)
            if handle is None:
                continue
            status = self.status(handle)
            if status.state is not WorkerState.PENDING:
                self._deadlines.cancel(name)
            if status.finished:
                self._exit_watch.report(handle, status)

    def _note_pull_error(self, name: str) -> None:
        """Keep a pod's ErrImagePull message: older kubelets' ImagePullBackOff drops it."""
        with self._lock:
            watcher = self._watcher
        pod = watcher.lookup(name)[0] if watcher is not None else None
        message = pull_error(pod.get("status") or {}) if pod is not None else None
        if message is not None:
            with self._lock:
                if name in self._workers:
                    self._pull_errors[name] = message

    def _deadline_passed(self, name: str) -> None:
        self._check([name])

    # -- the lease ----------------------------------------------------------------------------
    def _ensure_lease(self, executor_id: str) -> KubeLease:
        """Hold the executor's Lease before its first pod exists (`_k8s_lease`; under lock);
        it goes with the last pod, as the Secret does."""
        if self._lease is None:
            from kubernetes import client

            lease = KubeLease(client.CoordinationV1Api(self._api_client()), self.namespace,
                              executor_id, duration=self.lease_duration, call=self._lease_call,
                              owners=self._owner_refs())
            lease.acquire()
            self._lease = lease
        return self._lease

    def _lease_call(self, verb: str, fn: Callable[..., Any], *args: Any) -> None:
        extra = {"_content_type": "application/merge-patch+json"} if verb == "patch" else {}
        with contextlib.suppress(ApiStatus):  # AlreadyExists: an earlier attempt landed
            self._retry.call(lambda: _finish(_call(
                verb, "leases", self.namespace, fn, *args, passthrough=frozenset({409}),
                _preload_content=False, _request_timeout=self.request_timeout, **extra)))

    def _delete_lease(self, name: str) -> None:
        from kubernetes import client

        try:
            _delete(self._retry, "leases", self.namespace,
                    client.CoordinationV1Api(self._api_client()).delete_namespaced_lease, name,
                    grace_period_seconds=0, timeout=self.request_timeout)
        except Exception as exc:  # cleanup goes on; the Lease lapses by itself
            log.warning("could not delete Lease %s: %s; it lapses in %.0fs", name, exc,
                        self.lease_duration)

    # -- secret, owner, client -------------------------------------------------------------
    def _ensure_secret(self, spec: WorkerSpec) -> str | None:
        """Create the backend's one Secret at the first worker that has ``secret_env``."""
        if not spec.secret_env:
            return None
        values = dict(spec.secret_env)
        with self._lock:
            if self._secret is not None:
                if self._secret[1] != values:
                    raise ConfigurationError(
                        "secret_env must be the same for every worker of one "
                        "KubernetesBackend (it is delivered through one Secret); got new values "
                        f"for {sorted(values)}")
                return self._secret[0]
            name = dns_label("fiberexec", spec.executor_id[:24], secrets.token_hex(3))
            labels = {LABEL_KEY: "secret", EXECUTOR_LABEL: spec.executor_id}
            body = build_secret(name, values, labels, self._owner_refs())
            core = self._core()
            with contextlib.suppress(ApiStatus):  # AlreadyExists: an earlier attempt landed
                self._retry.call(lambda: _finish(_call(
                    "create", "secrets", self.namespace, core.create_namespaced_secret,
                    self.namespace, body, passthrough=frozenset({409}), _preload_content=False,
                    _request_timeout=self.request_timeout)))
            self._secret = (name, values)
            return name

    def _delete_secret(self, name: str) -> None:
        try:
            _delete(self._retry, "secrets", self.namespace,
                    self._core().delete_namespaced_secret, name, grace_period_seconds=0,
                    timeout=self.request_timeout)
        except Exception as exc:  # cleanup goes on
            log.warning("could not delete Secret %s: %s; run remove_stray()", name, exc)

    def _owner_refs(self) -> list[Json]:
        with self._lock:
            if self._owners is None:
                self._owners = self._lookup_owner()
            return list(self._owners)

    def _lookup_owner(self) -> list[Json]:
        if not self.owner_pod:
            return []
        try:
            return [owner_reference(self._read_pod(self.owner_pod, frozenset({404})))]
        except ApiStatus:
            if self._owner_auto:
                log.warning("HOSTNAME %s is not a pod in namespace %s; workers get no owner",
                            self.owner_pod, self.namespace)
                return []
            raise PermanentBackendError(
                f'owner_pod "{self.owner_pod}" not found in namespace "{self.namespace}"; pass '
                "the executor pod's name, or owner_pod=\"\" for none") from None

    def _core(self) -> Any:
        with self._lock:
            if self._core_api is None:
                from kubernetes import client

                self._core_api = client.CoreV1Api(self._api_client())
            return self._core_api

    def _api_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = make_api_client(self._kubeconfig, self._context)
            return self._client


def remove_stray(api_client: Any = None, namespace: str | None = None,
                 executor_id: str | None = None, *, sweep: Sweep | None = None,
                 now: float | None = None) -> list[str]:
    """Delete worker pods whose executor's Lease lapsed (or those ``sweep`` picks).

    An executor renews a Lease (`_k8s_lease`) while it runs; a pod goes when its executor's
    Lease is missing or was not renewed within its duration (judged at ``now``, default this
    machine's clock). ``executor_id`` deletes that executor's pods, Secret and Lease, live or
    not. Needs ``list`` on pods, secrets and leases besides the executor's Role (see
    ``docs/kubernetes-rbac.yaml``).

    Returns:
        one line per object deleted.
    """
    require_client()
    from kubernetes import client

    sweep = sweep or Sweep(executor_id=executor_id, namespace=namespace)
    namespace = namespace or sweep.namespace or default_namespace(None, None)
    owned = api_client is None
    api_client = api_client or make_api_client(None, None)
    try:
        return _Sweeper(client.CoreV1Api(api_client), client.CoordinationV1Api(api_client),
                        namespace, sweep).run(time.time() if now is None else now)
    finally:
        if owned:
            api_client.close()


class _Sweeper:
    """One ``remove_stray`` pass over a namespace: list, judge by the leases, delete."""

    def __init__(self, core: Any, coordination: Any, namespace: str, sweep: Sweep) -> None:
        self.namespace, self.sweep, self.retry = namespace, sweep, RetryPolicy()
        self.apis = {"pods": (core.list_namespaced_pod, core.delete_namespaced_pod),
                     "secrets": (core.list_namespaced_secret, core.delete_namespaced_secret),
                     "leases": (coordination.list_namespaced_lease,
                                coordination.delete_namespaced_lease)}

    def items(self, resource: str) -> list[Json]:
        resp = self.retry.call(functools.partial(
            _call, "list", resource, self.namespace, self.apis[resource][0], self.namespace,
            label_selector=LABEL_KEY, _preload_content=False, _request_timeout=30))
        return list_items(resp)

    def run(self, now: float) -> list[str]:
        leases = self.items("leases")
        held = held_leases(leases, now)
        lapsed = {_executor(lease) for lease in leases} - held
        lines, gone = [], set()
        for pod in self.items("pods"):
            labels = pod["metadata"].get("labels") or {}
            executor = labels.get(EXECUTOR_LABEL, "")
            is_held = None if LEASE_LABEL not in labels else executor in held
            if labels.get(LABEL_KEY) != "worker" or not self.sweep.picks(executor, is_held):
                continue
            gone.add(executor)
            lines.append(self.delete("pods", pod, f"worker {labels.get(WORKER_LABEL, '?')}",
                                     self.sweep.why(is_held)))
        for resource, items in (("secrets", self.items("secrets")), ("leases", leases)):
            for item in items:
                executor = _executor(item)
                if self._goes_with_workers(executor, executor in held, gone | lapsed):
                    lines.append(self.delete(resource, item, resource[:-1],
                                             self.sweep.why(executor in held)))
        return lines

    def _goes_with_workers(self, executor: str, held: bool, gone: set[str]) -> bool:
        """A Secret or Lease goes with its executor named, with everything, or when its
        Lease lapsed or its workers went and its Lease is not held."""
        if self.sweep.everything or self.sweep.executor_id is not None:
            return self.sweep.picks(executor, held)
        return executor in gone and not held

    def delete(self, resource: str, item: Json, what: str, why: str) -> str:
        name = item["metadata"]["name"]
        executor = (item["metadata"].get("labels") or {}).get(EXECUTOR_LABEL, "?")
        if not self.sweep.dry_run:
            _delete(self.retry, resource, self.namespace, self.apis[resource][1], name,
                    grace_period_seconds=1, timeout=30)
        return (f"{self.sweep.verb()} {resource[:-1]} {name} ({what} of executor {executor}: "
                f"{why})")


def _executor(item: Json) -> str:
    return str((item["metadata"].get("labels") or {}).get(EXECUTOR_LABEL, ""))


# -- helpers ---------------------------------------------------------------------------------
def _call(verb: str, resource: str, namespace: str | None, fn: Callable[..., Any],
          *args: Any, passthrough: frozenset[int] = frozenset(), **kwargs: Any) -> Any:
    """One API call with its errors translated (codes in ``passthrough``: `ApiStatus`)."""
    with api_errors(verb, resource, namespace, passthrough=passthrough):
        return fn(*args, **kwargs)


def _delete(retry: RetryPolicy, resource: str, namespace: str, fn: Callable[..., Any],
            name: str, *, grace_period_seconds: int, timeout: float) -> int:
    """Delete one object, retried; 1 if deleted now, 0 if it was already gone."""
    def attempt() -> int:
        try:
            with api_errors("delete", resource, namespace, passthrough=frozenset({404})):
                _finish(fn(name, namespace, grace_period_seconds=grace_period_seconds,
                           propagation_policy="Background", _preload_content=False,
                           _request_timeout=timeout))
        except ApiStatus:
            return 0
        return 1
    return retry.call(attempt)


def _check_options(api_client: Any, kubeconfig: str | None, context: str | None,
                   pod_template: Mapping[str, Any] | None, pending_deadline: float) -> None:
    if api_client is not None and (kubeconfig or context):
        raise ConfigurationError("pass either api_client= or kubeconfig=/context=, not both")
    if pod_template is not None and not isinstance(pod_template, Mapping):
        raise ConfigurationError(f"pod_template must be a dict (a partial Pod manifest), got "
                                 f"{type(pod_template).__name__}")
    if pending_deadline <= 0:
        raise ConfigurationError(f"pending_deadline must be > 0 seconds, got {pending_deadline}")


def _finish(resp: Any) -> None:
    """Read a raw response to its end so its connection can serve the next request."""
    resp.drain_conn()
    resp.release_conn()
