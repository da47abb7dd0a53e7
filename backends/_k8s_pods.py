"""Pure functions: a `WorkerSpec` becomes a Pod manifest; a Pod's status becomes a `WorkerStatus`.

No I/O here, so every rule is testable on plain dicts. Manifests are JSON-ready dicts (the
client sends them as they are), and pods read back are the API server's raw JSON.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from fiberexec.backend import (
    ConfigurationError,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)

CONTAINER = "worker"
GPU_RESOURCE = "nvidia.com/gpu"
#: Waiting reasons no amount of waiting fixes: the pod fails at once instead of at the deadline.
HOPELESS_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull"})
#: Waiting reasons of a failed image pull; the kubelet alternates them while it backs off.
PULL_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff"})
#: What registries and runtimes say when the image or tag does not exist or access is denied
#: (containerd, CRI-O, Docker; Docker Hub, GCR/Artifact Registry, ECR, Harbor, Quay).
_IMAGE_MISSING = re.compile(
    r"not found|manifest unknown|name unknown|repository does not exist|pull access denied"
    r"|access denied|access to the resource is denied|unauthorized|forbidden"
    r"|insufficient_scope|authorization failed|code = NotFound", re.IGNORECASE)
#: ... and what they say when the registry is slow, overloaded or unreachable: worth waiting.
_PULL_TRANSIENT = re.compile(
    r"timeout|timed out|too many requests|toomanyrequests|rate limit|connection refused"
    r"|connection reset|no such host|temporar|unavailable|\b50[0234]\b|EOF|TLS handshake",
    re.IGNORECASE)
_BACKOFF_DETAIL = ": ErrImagePull: "  # kubelet >= 1.32 repeats the pull error while backing off
_GENERIC_REASONS = frozenset({"Error", "Completed"})
_SIGNAL_BASE = 128  # container runtimes report death by signal N as exit code 128 + N
_NOT_DNS = re.compile(r"[^a-z0-9-]+")

Json = dict[str, Any]


def dns_label(*parts: str, limit: int = 63) -> str:
    """``parts`` joined into a valid DNS-1123 label (pod and secret names)."""
    text = _NOT_DNS.sub("-", "-".join(parts).lower()).strip("-") or "fiberexec"
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]  # keeps truncated names distinct
    return f"{text[: limit - 9].rstrip('-')}-{digest}"


def cpu_quantity(cpu: float) -> str:
    return f"{max(1, round(cpu * 1000))}m"


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> Json:
    """``over`` merged into a copy of ``base``; ``over`` wins on conflicts.

    Dicts merge key by key. Lists whose items are all dicts with a ``name`` merge item by item
    on that name (as Kubernetes merges containers, env, volumes); other lists are replaced.
    """
    merged: Json = copy.deepcopy(dict(base))
    for key, value in over.items():
        old = merged.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(old, value)
        elif isinstance(old, list) and _named_list(old) and _named_list(value):
            merged[key] = _merge_named(old, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, Mapping) and "name" in item for item in value
    )


def _merge_named(base: list[Any], over: list[Any]) -> list[Any]:
    result = [copy.deepcopy(item) for item in base]
    index = {item["name"]: i for i, item in enumerate(result)}
    for item in over:
        if item["name"] in index:
            result[index[item["name"]]] = deep_merge(result[index[item["name"]]], item)
        else:
            result.append(copy.deepcopy(item))
    return result


def owner_reference(owner: Mapping[str, Any]) -> Json:
    """An ownerReference to the executor's pod: deleting that pod garbage-collects ours."""
    meta = owner["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


def build_secret(name: str, values: Mapping[str, str], labels: Mapping[str, str],
                 owners: list[Json]) -> Json:
    meta: Json = {"name": name, "labels": dict(labels)}
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "stringData": dict(values)}


def build_pod(spec: WorkerSpec, *, name: str, image: str, secret_name: str | None,
              template: Mapping[str, Any], owners: list[Json]) -> Json:
    """The worker's Pod: template defaults < ``pod_template`` < what fiberexec requires."""
    defaults: Json = {"spec": {"automountServiceAccountToken": False,
                               "enableServiceLinks": False}}
    required: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.all_labels()},
        "spec": {"restartPolicy": "Never", "containers": [_container(spec, image, secret_name)]},
    }
    if owners:
        required["metadata"]["ownerReferences"] = owners
    return deep_merge(deep_merge(defaults, template), required)


def _container(spec: WorkerSpec, image: str, secret_name: str | None) -> Json:
    env: list[Json] = [{"name": k, "value": v} for k, v in spec.env.items()]
    for key in spec.secret_env:
        if secret_name is None:  # pragma: no cover - the backend always creates one first
            raise ConfigurationError("secret_env needs a Secret; none was created")
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret_name,
                                                                "key": key}}})
    container: Json = {"name": CONTAINER, "image": image, "command": list(spec.command),
                       "env": env}
    if spec.workdir:
        container["workingDir"] = spec.workdir
    amounts = _resources(spec)
    if amounts:
        container["resources"] = {"requests": dict(amounts), "limits": dict(amounts)}
    return container


def _resources(spec: WorkerSpec) -> dict[str, str]:
    res = spec.resources
    amounts: dict[str, str] = {}
    if res.cpu is not None:
        amounts["cpu"] = cpu_quantity(res.cpu)
    if res.memory is not None:
        amounts["memory"] = str(res.memory)
    if res.gpu:
        amounts[GPU_RESOURCE] = str(res.gpu)
    return amounts


def worker_status(pod: Mapping[str, Any], *, pending_for: float, pending_deadline: float,
                  last_pull_error: str | None = None) -> WorkerStatus:
    """What a pod's status means for its worker.

    Pending past ``pending_deadline`` (or with a hopeless waiting reason, or an image pull the
    registry refused because the image does not exist or access is denied) is FAILED with the
    pod's reason; a terminated container is EXITED with its code and reason (OOMKilled);
    a Failed pod whose container never ran (Evicted before start) is FAILED.
    ``last_pull_error`` is the pod's last ``ErrImagePull`` message, for kubelets whose
    ``ImagePullBackOff`` message does not repeat it.
    """
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    terminated = _container_state(status, "terminated")
    if phase in ("Succeeded", "Failed") or terminated is not None:
        return _finished(status, terminated)
    if phase == "Running":
        return WorkerStatus(WorkerState.RUNNING)
    if phase == "Unknown":
        return WorkerStatus(WorkerState.RUNNING, reason="Unknown: node not reporting")
    reason, waiting = pending_reason(status)
    refused = image_refused(status, last_pull_error)
    if refused is not None:
        return WorkerStatus(WorkerState.FAILED, reason=f"ErrImagePull: {refused}")
    if waiting in HOPELESS_WAITING or pending_for > pending_deadline:
        return WorkerStatus(WorkerState.FAILED, reason=reason or
                            f"Pending: not running after {pending_deadline:g}s")
    return WorkerStatus(WorkerState.PENDING, reason=reason)


def pull_error(status: Mapping[str, Any]) -> str | None:
    """The kubelet's message for the worker container's failed image pull, if it shows one."""
    waiting = _container_state(status, "waiting")
    if waiting is None or waiting.get("reason") not in PULL_WAITING:
        return None
    message = str(waiting.get("message") or "")
    if waiting.get("reason") == "ImagePullBackOff":
        message = message.partition(_BACKOFF_DETAIL)[2]
    return message or None


def image_refused(status: Mapping[str, Any], last_pull_error: str | None) -> str | None:
    """The pull error, when it says the image or tag does not exist or access is denied.

    Transient registry trouble (timeouts, rate limits, 5xx) returns None: the pod keeps its
    ``pending_deadline``, as the kubelet keeps retrying.
    """
    waiting = _container_state(status, "waiting")
    if waiting is None or waiting.get("reason") not in PULL_WAITING:
        return None
    message = pull_error(status) or last_pull_error
    if message and _IMAGE_MISSING.search(message) and not _PULL_TRANSIENT.search(message):
        return message
    return None


def deleted_status(pod: Mapping[str, Any] | None) -> WorkerStatus:
    """The worker of a pod that vanished from the API (deleted by someone, or evicted)."""
    if pod is not None:
        terminated = _container_state(pod.get("status") or {}, "terminated")
        if terminated is not None:
            return _finished(pod.get("status") or {}, terminated, default="Deleted")
    return WorkerStatus(WorkerState.UNKNOWN, reason="Deleted: the pod was removed")


def _finished(status: Mapping[str, Any], terminated: Mapping[str, Any] | None,
              default: str | None = None) -> WorkerStatus:
    pod_reason = _joined(status.get("reason"), status.get("message"))  # Evicted: ...
    if terminated is None:
        if status.get("phase") == "Succeeded":
            return WorkerStatus(WorkerState.EXITED, exit_code=0)
        return WorkerStatus(WorkerState.FAILED, reason=pod_reason or default or "Failed")
    reason = terminated.get("reason")
    if reason in _GENERIC_REASONS:
        reason = None
    return WorkerStatus(WorkerState.EXITED, exit_code=_exit_code(terminated.get("exitCode")),
                        reason=pod_reason or reason or default)


def _exit_code(code: Any) -> int | None:
    """The runtime's exit code, with ``128 + N`` (killed by signal N) turned into ``-N``, as
    `WorkerStatus` has it. A worker that calls ``sys.exit(137)`` itself looks the same."""
    if not isinstance(code, int):
        return None
    return -(code - _SIGNAL_BASE) if _SIGNAL_BASE < code <= _SIGNAL_BASE + 64 else code


def pending_reason(status: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(``"Reason: message"``, waiting reason) explaining why a pod is not running yet."""
    waiting = _container_state(status, "waiting")
    if waiting is not None and waiting.get("reason") not in (None, "ContainerCreating"):
        return _joined(waiting.get("reason"), waiting.get("message")), waiting.get("reason")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _joined(condition.get("reason") or "Unschedulable",
                           condition.get("message")), None
    return None, None


def _container_state(status: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER:
            state = (container.get("state") or {}).get(key)
            return state if isinstance(state, Mapping) else None
    return None


def _joined(reason: Any, message: Any) -> str | None:
    if not reason:
        return None
    return f"{reason}: {message}" if message else str(reason)
