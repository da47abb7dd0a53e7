"""Exit watching for backends: which workers are watched, and each exit delivered once.

A backend composes one `ExitWatch` and feeds it from whatever tells it that jobs end (a reaper
thread, an event stream, a shared watch), or lets it poll `Backend.status`::

    watch(handle, listener) ──> table: key(handle) -> (handle, listener)
    an exit seen anywhere ──> report(handle, status) ──> listener(handle, status), at most once
    unwatch(handle) / clear() ──> the listener is never called

`report` takes the listener out of the table under the lock and calls it outside, so two
threads that see the same exit (an event and a poll, say) deliver it once between them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fiberexec._backend import ExitListener, WorkerHandle, WorkerStatus


def _worker_id(handle: WorkerHandle) -> str:
    return handle.worker_id


class ExitWatch:
    """A thread-safe table of watched workers that reports each one's exit exactly once.

    Args:
        key: what the table is keyed by (default the worker id); a backend whose events name
            jobs differently keys by that (Kubernetes: ``lambda h: h.ref``, the pod name).

    Example:
        >>> class MyBackend(Backend):  # doctest: +SKIP
        ...     def __init__(self) -> None:
        ...         self._exits = ExitWatch()
        ...     def watch(self, handle, listener):
        ...         self._exits.watch(handle, listener)
        ...         self._exits.poll(self.status, interval=1.0, name="mine-watch")
        ...     def unwatch(self, handle):
        ...         self._exits.unwatch(handle)
    """

    def __init__(self, key: Callable[[WorkerHandle], str] = _worker_id) -> None:
        self._key = key
        self._lock = threading.Lock()
        self._watched: dict[str, tuple[WorkerHandle, ExitListener]] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        """Call ``listener`` at the next `report` of ``handle`` (replacing an earlier one)."""
        with self._lock:
            self._watched[self._key(handle)] = (handle, listener)

    def unwatch(self, handle: WorkerHandle) -> None:
        """Forget ``handle``: its exit is not reported (it was stopped on purpose)."""
        with self._lock:
            self._watched.pop(self._key(handle), None)

    def get(self, key: str) -> WorkerHandle | None:
        """The watched handle under ``key``, or None if it is not (or no longer) watched."""
        with self._lock:
            entry = self._watched.get(key)
        return entry[0] if entry is not None else None

    def keys(self) -> list[str]:
        """The keys of every watched handle, as a snapshot."""
        with self._lock:
            return list(self._watched)

    def report(self, handle: WorkerHandle, status: WorkerStatus) -> bool:
        """Deliver ``handle``'s exit to its listener and forget it; False if not watched.

        The listener gets the handle it was registered with, on the calling thread, outside
        the lock (so it may call back into the backend, or into this watch).
        """
        with self._lock:
            entry = self._watched.pop(self._key(handle), None)
        if entry is None:
            return False
        watched, listener = entry
        listener(watched, status)
        return True

    def clear(self) -> list[WorkerHandle]:
        """Forget every watched handle without reporting it; return them (to stop them)."""
        with self._lock:
            handles = [handle for handle, _ in self._watched.values()]
            self._watched.clear()
        return handles

    def poll(self, status: Callable[[WorkerHandle], WorkerStatus], *, interval: float,
             name: str) -> None:
        """Start a thread named ``name`` that calls ``status`` on every watched handle each
        ``interval`` seconds and reports those finished; for backends with no event stream.

        Starting it again does nothing; after `stop_polling` it does not start at all.
        """
        with self._lock:
            if self._thread is not None or self._stopped.is_set():
                return
            self._thread = threading.Thread(target=self._poll, args=(status, interval),
                                            name=name, daemon=True)
            self._thread.start()

    def stop_polling(self, timeout: float = 5.0) -> bool:
        """Stop the polling thread and wait up to ``timeout`` seconds for it; True once it
        ended (or never ran). Called from the polling thread itself, it does not wait."""
        self._stopped.set()
        with self._lock:
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return thread is None
        thread.join(timeout)
        return not thread.is_alive()

    def _poll(self, status: Callable[[WorkerHandle], WorkerStatus], interval: float) -> None:
        while not self._stopped.wait(interval):
            with self._lock:
                handles = [handle for handle, _ in self._watched.values()]
            for handle in handles:
                if self._stopped.is_set():
                    return
                found = status(handle)
                if found.finished:
                    self.report(handle, found)
