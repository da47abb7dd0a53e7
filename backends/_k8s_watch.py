"""One Kubernetes watch per backend: a cache of the executor's pods, kept current by events.

    list (labelSelector) ──> cache + resourceVersion ──> watch?resourceVersion=rv ──> events
          ^                                                   │ ADDED/MODIFIED/DELETED
          └──────── 410 Gone / error (after backoff) ─────────┘ BOOKMARK: rv only

The watch thread owns the stream; the cache is read by any thread under a lock. After every
change it calls ``on_change(names)`` (outside the lock) so the backend can report finished
workers. `Deadlines` is the timer that fires when a pod stayed Pending too long.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fiberexec.backend import BackendError
from fiberexec.backends._k8s_errors import ApiStatus, api_errors, translate

log = logging.getLogger("fiberexec.backends.kubernetes")
Json = dict[str, Any]


class PodWatcher:
    """Keeps the pods matching ``selector`` in ``namespace`` cached from one watch stream."""

    def __init__(self, core: Any, namespace: str, selector: str, *,
                 on_change: Callable[[list[str]], None], wanted: Callable[[str], bool],
                 request_timeout: float = 30.0, watch_seconds: int = 300) -> None:
        self._core = core
        self._namespace = namespace
        self._selector = selector
        self._on_change = on_change
        self._wanted = wanted  # tombstones are kept only for pods the backend still tracks
        self._request_timeout = request_timeout
        self._watch_seconds = watch_seconds
        self._cond = threading.Condition()
        self._pods: dict[str, Json] = {}
        self._gone: dict[str, Json | None] = {}
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="fiberexec-kubernetes-watch",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the stream now (not at its server timeout) and join the thread."""
        self._stop.set()
        with self._cond:
            resp, self._resp = self._resp, None
            self._cond.notify_all()
        if resp is not None:
            _shutdown(resp)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- reads (any thread) ---------------------------------------------------------------
    def lookup(self, name: str) -> tuple[Json | None, bool]:
        """(latest pod or tombstone, whether the pod was deleted)."""
        with self._cond:
            if name in self._gone:
                return self._gone[name], True
            return self._pods.get(name), False

    def live_names(self) -> set[str]:
        with self._cond:
            return set(self._pods)

    def seed(self, pod: Json) -> None:
        """Cache a pod from a create response unless the stream already delivered it."""
        name = pod["metadata"]["name"]
        with self._cond:
            if name not in self._pods and name not in self._gone:
                self._pods[name] = pod

    def forget(self, name: str) -> None:
        with self._cond:
            self._gone.pop(name, None)

    def wait_gone(self, names: Iterable[str], timeout: float) -> set[str]:
        """Block until none of ``names`` is live (or ``timeout``); return those still live."""
        wanted = set(names)
        with self._cond:
            self._cond.wait_for(lambda: not (wanted & set(self._pods)) or self._stop.is_set(),
                                timeout=timeout)
            return wanted & set(self._pods)

    # -- the watch thread -----------------------------------------------------------------
    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._follow(version)
                failures = 0
            except BackendError as exc:
                if self._stop.is_set():
                    return  # stop() cut the stream: not a failure
                failures += 1
                version = None
                delay = min(30.0, 0.2 * 2 ** min(failures, 8))
                log.warning("kubernetes pod watch failed (%s); re-listing in %.1fs", exc, delay)
                self._stop.wait(delay)  # backoff that a close() cuts short

    def _relist(self) -> str:
        with api_errors("list", "pods", self._namespace):
            resp = self._core.list_namespaced_pod(
                self._namespace, label_selector=self._selector, _preload_content=False,
                _request_timeout=self._request_timeout)
        body = json.loads(resp.data)
        version = str(body["metadata"]["resourceVersion"])
        fresh = {item["metadata"]["name"]: item for item in body.get("items") or []}
        with self._cond:
            vanished = {n: p for n, p in self._pods.items()
                        if n not in fresh and _not_newer(p, version)}
            kept = {n: p for n, p in self._pods.items() if n not in fresh and n not in vanished}
            self._pods = {**kept, **fresh}
            for name, pod in vanished.items():
                self._bury(name, pod)
            self._cond.notify_all()
        self._on_change(sorted({*fresh, *vanished}))
        return version

    def _follow(self, version: str) -> str | None:
        """Apply one watch stream's events; return the last version, or None to re-list."""
        timeouts = (self._request_timeout, self._watch_seconds + self._request_timeout)
        try:
            with api_errors("watch", "pods", self._namespace, passthrough=frozenset({410})):
                resp = self._core.list_namespaced_pod(
                    self._namespace, label_selector=self._selector, watch=True,
                    resource_version=version, allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_seconds, _preload_content=False,
                    _request_timeout=timeouts)
        except ApiStatus:
            return None  # 410 Gone: our version was compacted away
        with self._cond:
            if self._stop.is_set():
                _shutdown(resp)
                return version
            self._resp = resp
        complete = False
        try:
            with api_errors("watch", "pods", self._namespace):
                for event in _events(resp):
                    next_version = self._apply(event)
                    if next_version is None:
                        return None
                    version = next_version
            complete = True
        finally:
            with self._cond:
                self._resp = None
            if not complete:
                resp.close()  # unread data or a cut socket: never back into the pool
            resp.release_conn()
        return version

    def _apply(self, event: Json) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                return None
            raise translate(_StatusError(obj), "watch", "pods", self._namespace)
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            name = obj["metadata"]["name"]
            with self._cond:
                if kind == "DELETED":
                    self._pods.pop(name, None)
                    self._bury(name, obj)
                else:
                    self._pods[name] = obj
                self._cond.notify_all()
            self._on_change([name])
        return version

    def _bury(self, name: str, pod: Json | None) -> None:
        if self._wanted(name):
            self._gone[name] = pod


class _StatusError:
    """Shape of an ApiException built from a watch ERROR event's Status object."""

    def __init__(self, status: Json) -> None:
        self.status = status.get("code", 500)
        self.reason = status.get("reason")
        self.body = json.dumps(status)
        self.headers: dict[str, str] = {}


def _events(resp: Any) -> Iterator[Json]:
    """JSON watch events from a chunked response, one per line, as they arrive."""
    pending = b""
    for chunk in resp.stream(65536, decode_content=True):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def _not_newer(pod: Json, version: str) -> bool:
    """True if ``pod`` predates a list at ``version`` (so its absence means it is deleted)."""
    try:
        return int(pod["metadata"]["resourceVersion"]) <= int(version)
    except (KeyError, TypeError, ValueError):  # versions are opaque in general: assume older
        return True


def _shutdown(resp: Any) -> None:
    shutdown = getattr(resp, "shutdown", None)
    if shutdown is not None:  # urllib3 >= 2.3: unblocks a read in another thread
        shutdown()
    else:  # pragma: no cover - older urllib3
        resp.close()


class Deadlines:
    """One thread calling ``fire(key)`` when a key's deadline passes, unless cancelled first.

    The thread exists only while some deadline is pending.
    """

    def __init__(self, fire: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fire = fire
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, str]] = []
        self._active: dict[str, float] = {}
        self._stopped = False
        self._thread: threading.Thread | None = None

    def add(self, key: str, when: float) -> None:
        with self._cond:
            self._active[key] = when
            heapq.heappush(self._heap, (when, key))
            if self._thread is None and not self._stopped:  # idle: the thread had exited
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="fiberexec-kubernetes-deadlines")
                self._thread.start()
            self._cond.notify()

    def cancel(self, key: str) -> None:
        with self._cond:
            if self._active.pop(key, None) is not None and not self._active:
                self._cond.notify()  # nothing left to time: let the thread end

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._wait_due()
                if due is None:
                    return
            for key in due:
                self._fire(key)

    def _wait_due(self) -> list[str] | None:
        while not self._stopped:
            now = self._clock()
            due = []
            while self._heap and self._heap[0][0] <= now:
                when, key = heapq.heappop(self._heap)
                if self._active.get(key) == when:
                    del self._active[key]
                    due.append(key)
            if due:
                return due
            if not self._active:  # nothing to time: end the thread, add() starts another
                break
            self._cond.wait(timeout=self._heap[0][0] - now)
        self._heap.clear()
        self._thread = None
        return None
