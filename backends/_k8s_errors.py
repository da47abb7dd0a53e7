"""The one place where Kubernetes client errors become fiberexec errors.

    ApiException 429            -> TransientBackendError(retry_after=<Retry-After>)
    ApiException 409/500/502/503/504, urllib3 / socket errors -> TransientBackendError
    ApiException 401, 403, 404 (namespace), 400, 422, other 4xx -> PermanentBackendError
    ValueError from the client's own model validation (v37+)   -> PermanentBackendError

Callers wrap each API call in ``with api_errors(verb, resource, namespace):``. A few status
codes mean something to the caller (404 on delete, 409 on create, 410 on watch): they are
raised as `ApiStatus` so the caller can decide, before any translation happens.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from fiberexec.backend import FiberExecError, PermanentBackendError, TransientBackendError

RBAC_DOC = "docs/kubernetes-rbac.yaml"
_TRANSIENT = frozenset({409, 429, 500, 502, 503, 504})


class ApiStatus(Exception):
    """A non-2xx answer the caller asked to handle itself (``passthrough=``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@contextlib.contextmanager
def api_errors(
    verb: str, resource: str, namespace: str | None, *, passthrough: frozenset[int] = frozenset()
) -> Iterator[None]:
    """Translate errors raised inside the block; codes in ``passthrough`` become `ApiStatus`."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        code = int(exc.status or 0)
        if code in passthrough:
            raise ApiStatus(code, _server_message(exc)) from exc
        raise translate(exc, verb, resource, namespace) from exc
    except ValueError as exc:  # the client's own (pydantic) validation of a manifest
        if isinstance(exc, FiberExecError):
            raise
        raise PermanentBackendError(
            f"invalid {resource} spec rejected by the kubernetes client before sending: {exc}; "
            "fix pod_template, labels or resources"
        ) from exc
    except (HTTPError, OSError) as exc:
        where = f"{verb} {resource}" + (f' in namespace "{namespace}"' if namespace else "")
        raise TransientBackendError(
            f"kubernetes API unreachable during {where}: {exc}; check the API server address "
            "and network (kubeconfig/context or in-cluster service)"
        ) from exc


def translate(exc: Any, verb: str, resource: str, namespace: str | None) -> Exception:
    """Return the fiberexec error for one `kubernetes.client.ApiException`."""
    code = int(exc.status or 0)
    message = _server_message(exc)
    where = f' in namespace "{namespace}"' if namespace else " cluster-wide"
    if code == 0:  # the client reports TLS failures this way
        return TransientBackendError(f"kubernetes API call {verb} {resource} failed: {message}")
    if code in _TRANSIENT:
        return TransientBackendError(
            f"kubernetes API answered {code} to {verb} {resource}{where}: {message}",
            retry_after=_retry_after(exc),
        )
    if code == 401:
        return PermanentBackendError(
            f"unauthorized: the API server rejected our credentials for {verb} {resource}; "
            "check kubeconfig/context or the service account token"
        )
    if code == 403:
        return PermanentBackendError(
            f"forbidden: cannot {verb} {resource}{where}; grant verb \"{verb}\" on "
            f"\"{resource}\" (see {RBAC_DOC}); server said: {message}"
        )
    if code == 404 and namespace and _names_namespace(exc):
        return PermanentBackendError(
            f'namespace "{namespace}" not found; create it (kubectl create namespace '
            f"{namespace}) or pass namespace= to KubernetesBackend"
        )
    if code == 422:
        return PermanentBackendError(
            f"invalid {resource} spec rejected by the API server (422): {message}; "
            "fix pod_template, labels or resources"
        )
    return PermanentBackendError(f"kubernetes API answered {code} to {verb} {resource}{where}: "
                                 f"{message}")


def _status_body(exc: Any) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _server_message(exc: Any) -> str:
    return str(_status_body(exc).get("message") or exc.reason or "no message")


def _names_namespace(exc: Any) -> bool:
    details = _status_body(exc).get("details") or {}
    return details.get("kind") == "namespaces"


def _retry_after(exc: Any) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: rare from the API server, fall back to backoff
        return None
