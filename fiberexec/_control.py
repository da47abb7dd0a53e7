"""The loopback control endpoint `fiberexec top` attaches to (``observe=True``).

    executor's process                               another process of the same user
      ControlServer thread: accept on 127.0.0.1:port  <--  {"token": ..., "since": t}
        -> one JSON snapshot (workers, stats, ...)    -->  fiberexec top / snapshot()
      <runtime dir>/<pid>-<executor id>.json, mode 0600: where it listens, and the token

The file is the only way to learn the token, and only its user can read it; the endpoint
listens on loopback only, answers one snapshot per connection, and never unpickles anything.
Clients are answered side by side, each given `IO_TIMEOUT` in all to ask: one that connects
and dawdles holds up no other.
The file is removed at shutdown; one whose process is gone (killed) is stale, ignored and
removed by the next reader.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUEST_MAX = 4096  # bytes of a request; more is not one
IO_TIMEOUT = 2.0  # seconds a client may take to ask, or to read the answer
CLIENTS_MAX = 8  # clients answered at once (each on a thread of its own); more wait
CLOSE_WAIT = 5.0  # seconds shutdown waits for the server thread


def runtime_dir() -> Path:
    """Where executors on this machine record their control endpoints."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "fiberexec"
    return Path.home() / ".cache" / "fiberexec" / "executors"


@dataclass(frozen=True)
class ExecutorEntry:
    """An executor with ``observe=True`` running on this machine, as its file records it.

    Attributes:
        executor_id: its id (as in its workers' names in logs).
        pid: its process.
        host, port: where its control endpoint listens (loopback).
        token: what a client must send to be answered.
        started: `time.time` when it started serving.
        program: the command line of its process.
        backend: its backend's name.
        path: the file.
    """

    executor_id: str
    pid: int
    host: str
    port: int
    token: str
    started: float
    program: str
    backend: str
    path: Path

    def ended(self) -> bool:
        """Whether it has ended: its file is gone (removed at its shutdown), or its
        process (one that does not answer may be stopped, or busy: not ended)."""
        return not self.path.exists() or not is_alive(self.pid)


class ControlServer:
    """Serves ``snapshot(since)`` as JSON to clients that send the token."""

    def __init__(self, executor_id: str, backend: str,
                 snapshot: Callable[[float], dict[str, Any]]) -> None:
        self.executor_id, self.backend = executor_id, backend
        self._snapshot = snapshot
        self.token = secrets.token_hex(16)
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._clients = threading.BoundedSemaphore(CLIENTS_MAX)
        self.path: Path | None = None

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        self._listener = listener
        self._wake_r, self._wake_w = os.pipe()
        self.path = _record(self.executor_id, listener.getsockname()[1], self.token,
                            self.backend)
        self._thread = threading.Thread(target=self._run, name="fiberexec-control",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join(CLOSE_WAIT)
        if self._listener is not None:
            self._listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._listener = None

    def _run(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fd == self._wake_r for key, _ in ready):
                    return
                if not self._clients.acquire(timeout=IO_TIMEOUT):
                    continue  # (all busy with clients that dawdle: they are cut off soon)
                try:
                    client, _ = self._listener.accept()
                except OSError:
                    self._clients.release()
                    continue
                threading.Thread(target=self._serve, args=(client,), daemon=True,
                                 name="fiberexec-control-client").start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client, contextlib.suppress(OSError):  # (a timeout is one)
                self._answer(client)
        finally:
            self._clients.release()

    def _answer(self, client: socket.socket) -> None:
        request = _read_line(client, time.monotonic() + IO_TIMEOUT)
        client.settimeout(IO_TIMEOUT)
        try:
            asked = json.loads(request)
            token, since = str(asked["token"]), float(asked.get("since", 0.0))
        except (ValueError, KeyError, TypeError):
            client.sendall(b'{"error": "a request is one JSON line with the token"}\n')
            return
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            client.sendall(b'{"error": "wrong token"}\n')
            return
        client.sendall(json.dumps(self._snapshot(since), default=str).encode() + b"\n")


def _read_line(client: socket.socket, deadline: float) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < REQUEST_MAX:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client did not ask in time")
        client.settimeout(left)
        chunk = client.recv(REQUEST_MAX)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def _record(executor_id: str, port: int, token: str, backend: str) -> Path:
    """Write this executor's file (mode 0600, in a 0700 directory), atomically."""
    directory = runtime_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{os.getpid()}-{executor_id}.json"
    entry = {"executor_id": executor_id, "pid": os.getpid(), "host": "127.0.0.1",
             "port": port, "token": token, "started": time.time(), "backend": backend,
             "program": " ".join(sys.argv)[:300]}
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    os.replace(partial, path)
    return path


# ---------------------------------------------------------------------------- clients


def list_executors() -> list[ExecutorEntry]:
    """Executors with ``observe=True`` running on this machine, oldest first (stale files,
    whose process is gone, are removed)."""
    directory = runtime_dir()
    entries = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        entry = _read(path)
        if entry is None:
            continue
        if not is_alive(entry.pid):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        entries.append(entry)
    return sorted(entries, key=lambda e: e.started)


def _read(path: Path) -> ExecutorEntry | None:
    try:
        raw = json.loads(path.read_text())
        return ExecutorEntry(str(raw["executor_id"]), int(raw["pid"]), str(raw["host"]),
                             int(raw["port"]), str(raw["token"]), float(raw["started"]),
                             str(raw.get("program", "")), str(raw.get("backend", "")), path)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # being written, or not ours to read


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process reusing the pid
        return False
    return True


def snapshot(entry: ExecutorEntry, since: float = 0.0, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the executor ``entry`` for a snapshot (see `fiberexec.observe`).

    Raises:
        ConnectionError: it did not answer (it ended, or is not an executor any more).
    """
    try:
        with socket.create_connection((entry.host, entry.port), timeout=timeout) as conn:
            conn.sendall(json.dumps({"token": entry.token, "since": since}).encode() + b"\n")
            data = b""
            while chunk := conn.recv(1 << 16):
                data += chunk
    except OSError as exc:
        raise ConnectionError(f"executor {entry.executor_id} (pid {entry.pid}) did not "
                              f"answer at {entry.host}:{entry.port}: {exc}") from exc
    try:
        answer: dict[str, Any] = json.loads(data)
    except ValueError:
        raise ConnectionError(f"executor {entry.executor_id} answered {data[:80]!r}, not a "
                              f"snapshot") from None
    if "error" in answer:
        raise ConnectionError(f"executor {entry.executor_id} refused: {answer['error']}")
    return answer
