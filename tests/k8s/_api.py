"""The emulator's non-streaming verbs: list, get, create, delete on pods, secrets, namespaces
and leases (coordination.k8s.io/v1), and a merge PATCH on leases."""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

from tests.k8s._store import Conflict, Json, SelectorError, parse_selector
from tests.k8s._validate import validate_lease, validate_pod, validate_secret

KINDS = {"pods": "Pod", "secrets": "Secret", "namespaces": "Namespace", "leases": "Lease"}
API_VERSIONS = {"leases": "coordination.k8s.io/v1"}  # the rest are core/v1


@dataclass(frozen=True)
class Request:
    verb: str
    resource: str
    namespace: str | None
    name: str | None
    query: dict[str, str]
    code: int = 0


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Json | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details or {}, headers or {}


def typed(resource: str, obj: Json) -> Json:
    return {"apiVersion": API_VERSIONS.get(resource, "v1"), "kind": KINDS[resource], **obj}


def _not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found',
                    {"name": name, "kind": resource})


class Api:
    """Non-streaming requests: the verbs on pods, secrets and namespaces."""

    def __init__(self, emu: Any) -> None:
        self.emu, self.store = emu, emu.store

    def handle(self, req: Request, body: Json) -> tuple[int, Json | str]:
        if req.resource == "version":
            return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulated"}
        if body.get("__invalid__"):
            raise ApiError(400, "BadRequest", "the request body is not a JSON object")
        if req.resource == "namespaces":
            return self._namespaces(req, body)
        if req.namespace is not None and req.namespace not in self.store.namespaces:
            raise _not_found("namespaces", req.namespace)
        handler = getattr(self, f"_{req.verb}")
        code, payload = handler(req, body)
        return code, payload

    def _namespaces(self, req: Request, body: Json) -> tuple[int, Json | str]:
        if req.verb == "create":
            name = (body.get("metadata") or {}).get("name", "")
            self.store.namespaces.add(name)
            return 201, typed("namespaces", {"metadata": {"name": name}})
        if req.verb == "get":
            if req.name not in self.store.namespaces:
                raise _not_found("namespaces", req.name or "")
            return 200, typed("namespaces", {"metadata": {"name": req.name},
                                              "status": {"phase": "Active"}})
        items = [{"metadata": {"name": n}} for n in sorted(self.store.namespaces)]
        return 200, {"kind": "NamespaceList", "apiVersion": "v1", "items": items,
                     "metadata": {"resourceVersion": str(self.store.version)}}

    def _list(self, req: Request, body: Json) -> tuple[int, Json | str]:
        try:
            selector = parse_selector(req.query.get("labelSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        items, version = self.store.list(req.resource, req.namespace, selector)
        return 200, {"kind": f"{KINDS[req.resource]}List",
                     "apiVersion": API_VERSIONS.get(req.resource, "v1"),
                     "metadata": {"resourceVersion": str(version)}, "items": items}

    def _get(self, req: Request, body: Json) -> tuple[int, Json | str]:
        assert req.namespace is not None
        assert req.name is not None
        if req.resource == "pods/log":
            return self._log(req)
        obj = self.store.get(req.resource, req.namespace, req.name)
        if obj is None:
            raise _not_found(req.resource, req.name)
        return 200, typed(req.resource, obj)

    def _create(self, req: Request, body: Json) -> tuple[int, Json | str]:
        if req.namespace is None:
            raise ApiError(405, "MethodNotAllowed", "create needs a namespace")
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if req.resource == "pods":
            return self._create_pod(req, body)
        if req.resource == "leases":
            return self._create_lease(req, body)
        errors = validate_secret(body)
        if errors:
            raise _invalid("Secret", meta.get("name", ""), errors)
        data = dict(body.pop("data", None) or {})
        for key, value in (body.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        secret = {"metadata": meta, "type": body.get("type", "Opaque"), "data": data}
        return 201, typed("secrets", self._store(req, secret))

    def _create_pod(self, req: Request, pod: Json) -> tuple[int, Json | str]:
        assert req.namespace is not None
        errors = validate_pod(pod)
        if errors:
            raise _invalid("Pod", pod["metadata"].get("name", ""), errors)
        pod.pop("apiVersion", None)
        pod.pop("kind", None)
        pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        created = self._store(req, pod)
        self.emu.kubelet.admit(created)
        return 201, typed("pods", created)

    def _create_lease(self, req: Request, lease: Json) -> tuple[int, Json | str]:
        errors = validate_lease(lease)
        if errors:
            raise _invalid("Lease", lease["metadata"].get("name", ""), errors)
        lease = {"metadata": lease["metadata"], "spec": dict(lease.get("spec") or {})}
        return 201, typed("leases", self._store(req, lease))

    def _patch(self, req: Request, body: Json) -> tuple[int, Json | str]:
        """A JSON merge patch (RFC 7386), which a strategic merge patch of plain fields is."""
        assert req.namespace is not None
        assert req.name is not None
        if req.resource != "leases":
            raise ApiError(405, "MethodNotAllowed", f"PATCH on {req.resource} is not emulated")

        def apply(obj: Json) -> None:
            merged = _merge(obj, body)
            errors = validate_lease(merged)
            if errors:
                raise _invalid("Lease", req.name or "", errors)
            obj.clear()
            obj.update(merged)

        updated = self.store.update(req.resource, req.namespace, req.name, apply)
        if updated is None:
            raise _not_found(req.resource, req.name)
        return 200, typed(req.resource, updated)

    def _store(self, req: Request, obj: Json) -> Json:
        assert req.namespace is not None
        obj.pop("apiVersion", None)
        obj.pop("kind", None)
        try:
            return self.store.create(req.resource, req.namespace, obj)
        except Conflict as exc:
            raise ApiError(409, "AlreadyExists", f'{req.resource} "{exc}" already exists',
                           {"name": str(exc), "kind": req.resource}) from exc

    def _delete(self, req: Request, body: Json) -> tuple[int, Json | str]:
        assert req.namespace is not None
        assert req.name is not None
        grace = float(req.query.get("gracePeriodSeconds") or body.get("gracePeriodSeconds", 30))
        if req.resource == "pods":
            pod = self.emu.kubelet.delete(req.namespace, req.name, grace)
            if pod is None:
                raise _not_found("pods", req.name)
            return 200, typed("pods", pod)
        if self.store.delete(req.resource, req.namespace, req.name) is None:
            raise _not_found(req.resource, req.name)
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                     "status": "Success", "details": {"name": req.name, "kind": req.resource}}

    def _deletecollection(self, req: Request, body: Json) -> tuple[int, Json | str]:
        raise ApiError(405, "MethodNotAllowed", "deletecollection is not emulated")

    def _log(self, req: Request) -> tuple[int, Json | str]:
        assert req.namespace is not None
        assert req.name is not None
        pod = self.store.get("pods", req.namespace, req.name)
        if pod is None:
            raise _not_found("pods", req.name)
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        state = statuses[0].get("state") or {}
        if "waiting" in state or not state:
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            raise ApiError(400, "BadRequest", f'container "{statuses[0].get("name", "")}" in pod '
                           f'"{req.name}" is waiting to start: {reason}')
        path = self.emu.kubelet.log_path(pod)
        text = path.read_text(errors="replace") if path.exists() else ""
        tail = req.query.get("tailLines")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail):]) if int(tail) > 0 else ""
        return 200, text


def _merge(target: Json, patch: Json) -> Json:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _invalid(kind: str, name: str, errors: list[tuple[str, str]]) -> ApiError:
    message = f'{kind} "{name}" is invalid: ' + ", ".join(f"{f}: {m}" for f, m in errors)
    causes = [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errors]
    return ApiError(422, "Invalid", message, {"name": name, "kind": kind.lower() + "s",
                                              "causes": causes})
