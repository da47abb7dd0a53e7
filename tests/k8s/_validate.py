"""The subset of the API server's validation that fiberexec can trip over (answered with 422)."""

from __future__ import annotations

import re
from typing import Any

from tests.k8s._kubelet import quantity

Json = dict[str, Any]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_RESTART = ("Always", "OnFailure", "Never")


def validate_meta(obj: Json) -> list[tuple[str, str]]:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    errors = []
    if not name:
        errors.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > 253 or not _SUBDOMAIN.match(name):
        errors.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 '
                       "subdomain must consist of lower case alphanumeric characters, '-' or '.'"))
    for key, value in (meta.get("labels") or {}).items():
        errors += _label(key, str(value))
    return errors


def _label(key: str, value: str) -> list[tuple[str, str]]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if (prefix and not _SUBDOMAIN.match(prefix)) or len(name) > 63 or not _LABEL_NAME.match(name):
        errors.append(("metadata.labels", f'Invalid value: "{key}": name part must consist of '
                       "alphanumeric characters, '-', '_' or '.' (at most 63)"))
    if len(value) > 63 or (value and not _LABEL_NAME.match(value)):
        errors.append(("metadata.labels", f'Invalid value: "{value}": a valid label must be '
                       "an empty string or consist of alphanumeric characters, '-', '_' or '.'"))
    return errors


def validate_pod(pod: Json) -> list[tuple[str, str]]:
    errors = validate_meta(pod)
    spec = pod.get("spec") or {}
    if spec.get("restartPolicy", "Always") not in _RESTART:
        errors.append(("spec.restartPolicy", f'Unsupported value: "{spec["restartPolicy"]}"'))
    containers = spec.get("containers") or []
    if not containers:
        errors.append(("spec.containers", "Required value"))
    for i, container in enumerate(containers):
        errors += _container(f"spec.containers[{i}]", container)
    return errors


def _container(path: str, container: Json) -> list[tuple[str, str]]:
    errors = []
    if not _DNS_LABEL.match(container.get("name") or ""):
        errors.append((f"{path}.name", f'Invalid value: "{container.get("name")}"'))
    if not container.get("image"):
        errors.append((f"{path}.image", "Required value"))
    for j, item in enumerate(container.get("env") or []):
        if not _ENV_NAME.match(item.get("name") or ""):
            errors.append((f"{path}.env[{j}].name", f'Invalid value: "{item.get("name")}"'))
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None and not (ref.get("name") and _SECRET_KEY.match(ref.get("key") or "")):
            errors.append((f"{path}.env[{j}].valueFrom.secretKeyRef", "Required value"))
    return errors + _resources(f"{path}.resources", container.get("resources") or {})


def _resources(path: str, resources: Json) -> list[tuple[str, str]]:
    errors = []
    amounts: dict[str, dict[str, float]] = {}
    for kind in ("requests", "limits"):
        for key, value in (resources.get(kind) or {}).items():
            try:
                amounts.setdefault(kind, {})[key] = quantity(value)
            except ValueError as exc:
                errors.append((f"{path}.{kind}[{key}]", f'Invalid value: "{value}": {exc}'))
    requests, limits = amounts.get("requests", {}), amounts.get("limits", {})
    for key, amount in requests.items():
        if key in limits and amount > limits[key]:
            errors.append((f"{path}.requests", f"Invalid value: must be less than or equal "
                           f"to {key} limit"))
        if "/" in key and key in limits and amount != limits[key]:
            errors.append((f"{path}.requests[{key}]", "Invalid value: must be equal to "
                           f"{key} limit"))
    return errors


def validate_secret(secret: Json) -> list[tuple[str, str]]:
    errors = validate_meta(secret)
    for key in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}:
        if not _SECRET_KEY.match(key):
            errors.append((f"data[{key}]", "Invalid value: a valid config key must consist of "
                           "alphanumeric characters, '-', '_' or '.'"))
    return errors


# RFC 3339 with microseconds, as the API server parses a MicroTime (Z or an offset)
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


def validate_lease(lease: Json) -> list[tuple[str, str]]:
    """coordination.k8s.io/v1 Lease: a positive duration, MicroTime timestamps."""
    errors = validate_meta(lease)
    spec = lease.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        errors.append(("spec.leaseDurationSeconds", f"Invalid value: {duration}: must be "
                       "greater than 0"))
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.match(value)):
            errors.append((f"spec.{key}", f'Invalid value: "{value}": not a MicroTime '
                           "(2006-01-02T15:04:05.000000Z)"))
    return errors
