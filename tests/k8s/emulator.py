"""A Kubernetes API server emulator on 127.0.0.1 for the official Python client, over HTTP.

    kubernetes.client ──HTTP/1.1──> _Handler (route, faults, validate) ──> Store (objects, rv,
                                         │ pods/log, watch streams          event log)
                                         └─> Kubelet: runs each pod's first container as a
                                             local process and reports its status back

Real: REST paths and verbs for pods, secrets and namespaces (core/v1) and leases
(coordination.k8s.io/v1, with a merge PATCH), Status bodies with the
API server's reasons, label selectors (=, ==, !=, in, notin, exists, !exists), one global
resourceVersion, chunked watch streams (ADDED/MODIFIED/DELETED, ERROR 410 after compaction),
graceful pod deletion (SIGTERM, SIGKILL after the grace period), pods/log with tailLines.
Simulated on request: 429/503 bursts, 403 per verb and resource, slow or failed scheduling,
image pull errors, OOMKilled (a SIGKILL labelled OOMKilled: memory limits are NOT enforced),
eviction. Not emulated: authn, RBAC beyond `forbid`, PUT, PATCH on anything but leases,
bookmarks, restarts
(restartPolicy is always treated as Never), init/sidecar containers (only the first runs).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s._api import KINDS as _KINDS
from tests.k8s._api import Api as _Api
from tests.k8s._api import ApiError, Request
from tests.k8s._api import typed as _typed
from tests.k8s._kubelet import Faults, Kubelet, PullFailure
from tests.k8s._store import Json, SelectorError, Store, matches, parse_selector

_MAX_WATCH = 1800.0


@dataclass
class _Burst:
    code: int
    remaining: int
    verbs: frozenset[str] | None
    resources: frozenset[str] | None
    retry_after: int | None


class Emulator:
    """Start with ``with Emulator(namespaces=["ns"]) as emu:``; ``emu.api_client()`` talks to it.

    Fault injection (all thread-safe, effective for the following requests/pods):
    `fail_next`, `forbid`, `slow_scheduling`, `unschedulable`, `fail_image_pull`, `kill_pod`,
    `oom_kill`, `evict`, `delete_pod`, `expire_watches`.
    """

    def __init__(self, namespaces: tuple[str, ...] | list[str] = ("default",),
                 runtime: str | None = None) -> None:
        self.store = Store()
        self.store.namespaces.update(namespaces)
        self.faults = Faults()
        self._logdir = Path(tempfile.mkdtemp(prefix="k8s-emulator-"))
        # pods run as local processes, or (FIBEREXEC_K8S_RUNTIME=docker) as containers
        self.runtime = runtime or os.environ.get("FIBEREXEC_K8S_RUNTIME", "process")
        self.kubelet = Kubelet(self.store, self.faults, self._logdir, self.runtime)
        self.requests: list[Request] = []
        self._bursts: list[_Burst] = []
        self._forbidden: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._epoch = 0  # bumped to end every open watch with 410 Gone
        self._stopping = False
        self._connections: set[socket.socket] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Emulator:
        handler = type("Handler", (_Handler,), {"emu": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.1}, name="k8s-emulator")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end watches, kill every pod process, remove temporary files."""
        with self.store.cond:
            self._stopping = True
            self.store.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            with self._lock:
                connections = list(self._connections)
            for conn in connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self.kubelet.shutdown()
        shutil.rmtree(self._logdir, ignore_errors=True)

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the emulator first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this emulator (plain HTTP, no auth)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    # -- inspection ------------------------------------------------------------------------
    def pods(self, namespace: str | None = None, selector: str | None = None) -> list[Json]:
        return self.store.list("pods", namespace, parse_selector(selector))[0]

    def secrets(self, namespace: str | None = None, selector: str | None = None) -> list[Json]:
        return self.store.list("secrets", namespace, parse_selector(selector))[0]

    def pod(self, namespace: str, name: str) -> Json | None:
        return self.store.get("pods", namespace, name)

    def running_processes(self) -> list[str]:
        return self.kubelet.running()

    def wait_for_pod(self, namespace: str, name: str, predicate: Callable[[Json | None], bool],
                     timeout: float = 10.0) -> Json | None:
        """Block (on store changes, no polling) until ``predicate(pod)``; TimeoutError if not."""
        with self.store.cond:
            if not self.store.cond.wait_for(
                    lambda: predicate(self.store.get("pods", namespace, name)), timeout=timeout):
                raise TimeoutError(f"pod {namespace}/{name} did not reach the expected state "
                                   f"within {timeout}s: {self.store.get('pods', namespace, name)}")
            return self.store.get("pods", namespace, name)

    def calls(self, verb: str, resource: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.verb == verb and r.resource == resource]

    # -- faults ----------------------------------------------------------------------------
    def fail_next(self, code: int, count: int, *, verbs: set[str] | None = None,
                  resources: set[str] | None = None, retry_after: int | None = None) -> None:
        """Answer the next ``count`` matching requests with ``code`` (429, 503, 500...)."""
        with self._lock:
            self._bursts.append(_Burst(code, count, frozenset(verbs) if verbs else None,
                                       frozenset(resources) if resources else None,
                                       retry_after))

    def forbid(self, verb: str, resource: str) -> None:
        """403 for ``verb`` on ``resource`` ("pods", "secrets", "pods/log"), as RBAC would."""
        with self._lock:
            self._forbidden.add((verb, resource))

    def permit(self, verb: str, resource: str) -> None:
        with self._lock:
            self._forbidden.discard((verb, resource))

    def slow_scheduling(self, seconds: float) -> None:
        self.faults.schedule_delay = seconds

    def lag_status(self, seconds: float) -> None:
        """Report a started container as Running only ``seconds`` later: a real kubelet
        publishes a start at its next status sync, while the container already runs."""
        self.faults.status_lag = seconds

    def unschedulable(self, message: str | None = "0/1 nodes are available: 1 node(s) didn't "
                      "match Pod's node affinity/selector.") -> None:
        self.faults.unschedulable = message

    def fail_image_pull(self, image: str, kind: str = "not-found", *,
                        backoff_detail: bool = False) -> None:
        """Pulling ``image`` fails as a registry would: ``kind`` is ``not-found`` (tag),
        ``no-repository``, ``unauthorized`` (refused: retrying cannot help) or ``timeout``,
        ``rate-limit`` (transient). See `tests.k8s._kubelet.pull_error_message`."""
        self.faults.pull_errors[image] = PullFailure(kind, backoff_detail)

    def kill_pod(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        self.kubelet.kill(namespace, name, sig)

    def oom_kill(self, namespace: str, name: str) -> None:
        """Simulate the kernel OOM killer: SIGKILL, reported as OOMKilled with exit code 137."""
        self.kubelet.kill(namespace, name, signal.SIGKILL, override="OOMKilled")

    def evict(self, namespace: str, name: str) -> None:
        """Simulate node-pressure eviction: the pod ends Failed with reason Evicted."""
        self.kubelet.kill(namespace, name, signal.SIGKILL, override="Evicted")

    def delete_pod(self, namespace: str, name: str, grace: float = 0) -> None:
        """Delete a pod behind the client's back (as kubectl delete would)."""
        self.kubelet.delete(namespace, name, grace)

    def expire_watches(self) -> None:
        """Compact the event log and end every open watch with an ERROR 410 event."""
        with self.store.cond:
            self.store.compact()
            self._epoch += 1
            self.store.cond.notify_all()

    # -- used by the handler ---------------------------------------------------------------
    def _admit(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)
            if (req.verb, req.resource) in self._forbidden:
                raise _forbidden(req)
            for burst in self._bursts:
                if burst.remaining > 0 and (burst.verbs is None or req.verb in burst.verbs) and (
                        burst.resources is None or req.resource in burst.resources):
                    burst.remaining -= 1
                    raise _burst_error(burst)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)


def _forbidden(req: Request) -> ApiError:
    resource = req.resource.partition("/")[0]
    subject = f'{resource} "{req.name}"' if req.name else resource
    where = f' in the namespace "{req.namespace}"' if req.namespace else " at the cluster scope"
    return ApiError(403, "Forbidden",
                    f'{subject} is forbidden: User "system:serviceaccount:emulator:default" '
                    f'cannot {req.verb} resource "{req.resource}" in API group ""{where}',
                    {"name": req.name or "", "kind": resource})


def _burst_error(burst: _Burst) -> ApiError:
    headers = {"Retry-After": str(burst.retry_after)} if burst.retry_after is not None else {}
    if burst.code == 429:
        return ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                        {"retryAfterSeconds": burst.retry_after or 1}, headers)
    return ApiError(burst.code, "ServiceUnavailable" if burst.code == 503 else "InternalError",
                    "the server is currently unable to handle the request (emulated)",
                    None, headers)


def _status(err: ApiError) -> Json:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": err.message, "reason": err.reason, "details": err.details,
            "code": err.code}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client hanging up mid-request (watch stopped, test over) is not news


class _Handler(BaseHTTPRequestHandler):
    emu: Emulator
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection is dropped after this

    def setup(self) -> None:
        super().setup()
        self.emu._track(self.connection, True)

    def finish(self) -> None:
        self.emu._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # quiet tests
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    # -- routing ---------------------------------------------------------------------------
    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body()
        try:
            req = _route(method, url.path, query)
            self.emu._admit(req)
            if req.verb == "watch":
                self._watch(req)
                return
            code, payload = _Api(self.emu).handle(req, body)
        except ApiError as err:
            self._send(err.code, _status(err), err.headers)
            return
        if isinstance(payload, str):
            self._send(code, payload.encode(), {}, "text/plain")
        else:
            self._send(code, payload, {})

    def _body(self) -> Json:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            data = json.loads(self.rfile.read(length))
        except ValueError:
            return {"__invalid__": True}
        return data if isinstance(data, dict) else {"__invalid__": True}

    def _send(self, code: int, payload: Json | bytes, headers: dict[str, str],
              content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)

    # -- watch -----------------------------------------------------------------------------
    def _watch(self, req: Request) -> None:
        try:
            selector = parse_selector(req.query.get("labelSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(OSError):
            for event in _Stream(self.emu, req, selector):
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        self.close_connection = True


class _Stream:
    """The events one watch request sends, from its resourceVersion until timeout or expiry."""

    def __init__(self, emu: Emulator, req: Request, selector: list[Any]) -> None:
        self.emu, self.req, self.selector = emu, req, selector
        timeout = float(req.query.get("timeoutSeconds") or _MAX_WATCH)
        self.deadline = time.monotonic() + min(timeout, _MAX_WATCH)

    def __iter__(self) -> Iterator[Json]:
        store, version = self.emu.store, self.req.query.get("resourceVersion") or "0"
        with store.cond:
            epoch = self.emu._epoch
            if version != "0" and int(version) < store.compacted:
                yield _gone(version)
                return
            if version == "0":  # start with the current state, as the API server does
                items, position = store.list(self.req.resource, self.req.namespace,
                                             self.selector)
                initial = [{"type": "ADDED", "object": _typed(self.req.resource, i)}
                           for i in items]
            else:
                position, initial = int(version), []
        yield from initial
        while True:
            with store.cond:
                store.cond.wait_for(functools.partial(self._news, position, epoch),
                                    timeout=max(0.0, self.deadline - time.monotonic()))
                if self.emu._stopping:
                    return
                if self.emu._epoch != epoch:
                    yield _gone(str(position))
                    return
                events = [e for e in store.events if e.version > position]
                position = store.version
            for event in events:
                if self._wanted(event):
                    yield {"type": event.kind, "object": _typed(event.resource, event.obj)}
            if time.monotonic() >= self.deadline:
                return

    def _news(self, position: int, epoch: int) -> bool:
        emu = self.emu
        return emu.store.version > position or emu._stopping or emu._epoch != epoch

    def _wanted(self, event: Any) -> bool:
        return (event.resource == self.req.resource
                and self.req.namespace in (None, event.namespace)
                and matches(event.obj, self.selector))


def _gone(version: str) -> Json:
    return {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {version}", "reason": "Expired", "code": 410}}


def _route(method: str, path: str, query: dict[str, str]) -> Request:
    parts = [p for p in path.split("/") if p]
    if parts in (["version"], ["api"]):
        return Request("get", "version", None, None, query)
    group = parts[:3] == ["apis", "coordination.k8s.io", "v1"]
    if parts[:2] != ["api", "v1"] and not group:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                       f"({method} {path})")
    rest = parts[3:] if group else parts[2:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or rest[0] not in _KINDS or len(rest) > 3 or group != (rest[0] == "leases"):
        raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                       f"({method} {path})")
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) == 3:
        if rest[2] != "log" or resource != "pods" or method != "GET":
            raise ApiError(404, "NotFound", f"unsupported subresource {rest[2]!r}")
        return Request("get", "pods/log", namespace, name, query)
    return Request(_verb(method, name, query), resource, namespace, name, query)


def _verb(method: str, name: str | None, query: dict[str, str]) -> str:
    if method == "GET":
        if name is not None:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    if method == "POST" and name is None:
        return "create"
    if method == "DELETE":
        return "delete" if name is not None else "deletecollection"
    if method == "PATCH" and name is not None:
        return "patch"
    raise ApiError(405, "MethodNotAllowed", f"{method} is not supported by the emulator")
