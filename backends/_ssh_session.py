"""One SSH session per worker: the system ``ssh`` client running the remote wrapper.

::

    Popen(ssh ... host 'exec python -c LOADER fiberexec-ssh-worker EXEC WORKER')
      stdin  --> one JSON message (code, env, secret_env, argv, limits), then term/kill and
                 ping lines; closing it (or this process dying, or no ping for the watchdog
                 period) ends the worker
      stdout <-- "#fiberexec-ssh {...}" reports (ready, error, exit) and the worker's output
      stderr <-- ssh's own complaints (refused, host key, timeout)

Two reader threads consume stdout and stderr; the stdout reader, on end of input, waits for
the client, settles the worker's final `WorkerStatus` and calls the exit listener once.
Failures before the wrapper reported ``ready`` become `TransientBackendError` (the network or
sshd may recover) or `PermanentBackendError` (refused keys, unknown host key, no Python, no
fiberexec), each naming the host and the fix; `classify` is the one place that decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fiberexec.backend import (
    BackendError,
    PermanentBackendError,
    TransientBackendError,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends._ssh_hosts import SSHHost

SSH_FAILED = 255  # the ssh client's own exit code for connection and authentication errors
SHELL_NOT_FOUND = 127
KEPT_LINES = 500
_CODE = Path(remote.__file__).read_text()

_PERMANENT = (
    ("Permission denied", "the host refused our key; add it to ~/.ssh/authorized_keys there, "
                          "or pass identity_file= / ssh_config="),
    ("Host key verification failed", "its host key is not in known_hosts; add it "
                                     "(ssh-keyscan, after checking it) or pass known_hosts="),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "its host key changed; check why, then fix "
                                               "known_hosts"),
    ("Could not resolve hostname", "the name does not resolve; fix the host entry"),
    ("Bad configuration option", "the ssh configuration is invalid; fix ssh_config= or "
                                 "ssh_options="),
)
ExitCallback = Callable[[WorkerStatus], None]


def frame(message: dict[str, Any]) -> bytes:
    """What `_ssh_remote.LOADER` reads: a 10-digit length, then the JSON message."""
    data = json.dumps(message).encode()
    return b"%010d" % len(data) + data


def remote_command(python: str, *marks: str) -> str:
    return " ".join(["exec", shlex.quote(python), "-c", shlex.quote(remote.LOADER),
                     *(shlex.quote(m) for m in marks)])


def classify(host: SSHHost, code: int, stderr: str, error: dict[str, Any] | None,
             worker_id: str) -> BackendError:
    """Turn a session that ended before ``ready`` into a transient or permanent error."""
    where = f"cannot start worker {worker_id} on ssh host {host.label}"
    said = " ".join(line.strip() for line in stderr.strip().splitlines()[-3:]) or "no message"
    if error is not None and error.get("kind") == "no-fiberexec":
        return PermanentBackendError(
            f"{where}: {error.get('python')} there cannot import fiberexec "
            f"({error.get('detail')}); install fiberexec into that Python, or set this host's "
            "python= to one that has it")
    if code == SHELL_NOT_FOUND:
        return PermanentBackendError(
            f"{where}: Python {host.python!r} was not found there ({said}); set this host's "
            "python= to an interpreter that exists on it")
    if code == SSH_FAILED:
        for needle, fix in _PERMANENT:
            if needle in stderr:
                return PermanentBackendError(f"{where}: ssh failed ({said}); {fix}")
        return TransientBackendError(
            f"{where}: ssh could not connect ({said}); check that sshd runs there and that "
            "the host is reachable from this machine")
    return PermanentBackendError(
        f"{where}: the remote side exited with code {code} before starting the worker "
        f"({said})")


class Session:
    """The ssh client process of one worker, and what it has reported."""

    def __init__(self, host: SSHHost, spec: WorkerSpec, argv: Sequence[str]) -> None:
        self.host = host
        self.worker_id = spec.worker_id
        self.argv = list(argv)
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.ssh_errors: deque[str] = deque(maxlen=50)
        self.pid: int | None = None
        self.notes: list[str] = []
        self.status: WorkerStatus | None = None
        self._error: dict[str, Any] | None = None
        self._exit_code: int | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._on_exit: ExitCallback | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr_reader: threading.Thread | None = None
        self._synced = threading.Condition()  # `sync`: answers seen, and asked
        self._syncs = [0, 0]

    # ------------------------------------------------------------ starting

    def start(self, message: dict[str, Any], timeout: float) -> int:
        """Run ssh and wait for the wrapper's ``ready``; return the worker's remote pid."""
        try:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise PermanentBackendError(
                f"cannot start worker {self.worker_id}: the ssh client {self.argv[0]!r} "
                f"cannot run ({exc}); install openssh-client or pass ssh=") from exc
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write(frame({"code": _CODE, **message}))
            self._proc.stdin.flush()
        # From now on only short lines are written; if ssh stops reading (a dead link), a
        # full pipe must drop them rather than block the thread that pings every session.
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, name="fiberexec-ssh-err", daemon=True)
        self._stderr_reader.start()
        threading.Thread(target=self._read_stdout, name="fiberexec-ssh-out", daemon=True).start()
        return self._await_ready(timeout)

    def _await_ready(self, timeout: float) -> int:
        ready = self._wait_either(timeout)
        if ready and self.pid is not None:
            return self.pid
        if not self._ended.is_set():
            self.kill()
            raise TransientBackendError(
                f"cannot start worker {self.worker_id} on ssh host {self.host.label}: no answer "
                f"within {timeout:.0f}s ({' '.join(self.ssh_errors) or 'ssh said nothing'})")
        raise classify(self.host, self._exit_code if self._exit_code is not None else -1,
                       "\n".join(self.ssh_errors), self._error, self.worker_id)

    def _wait_either(self, timeout: float) -> bool:
        """Block until ready or ended (no polling: both set the ready event)."""
        self._ready.wait(timeout)
        return self.pid is not None and not (self._ended.is_set() and self._error is not None)

    # ------------------------------------------------------------ reading

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            text = raw.decode(errors="replace").rstrip("\n")
            self.ssh_errors.append(text)
            self.lines.append(f"ssh: {text}\n")

    def _read_stdout(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for raw in proc.stdout:
            text = raw.decode(errors="replace")
            if text.startswith(remote.TAG):
                self._on_report(text[len(remote.TAG):])
            else:
                self.lines.append(text)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stdout closed but the client lingers
            proc.kill()
            code = proc.wait(timeout=30)
        if self._stderr_reader is not None:
            self._stderr_reader.join(timeout=30)  # its last lines may explain the end
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        self.close_stdin()
        self._settle(code)

    def _on_report(self, text: str) -> None:
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            self.lines.append(remote.TAG + text)
            return
        kind = event.get("event")
        if kind == "ready":
            self.pid = int(event["pid"])
            self.notes = [str(n) for n in event.get("notes", [])]
            self._ready.set()
        elif kind == "error":
            self._error = event
        elif kind == "exit":
            self._exit_code = int(event["code"])
        elif kind == "note":
            self.lines.append(f"fiberexec-ssh: {event.get('text')}\n")
        elif kind == "synced":
            with self._synced:
                self._syncs[0] = max(self._syncs[0], int(event["n"]))
                self._synced.notify_all()

    def _settle(self, client_code: int) -> None:
        if self._exit_code is not None:
            status = WorkerStatus(WorkerState.EXITED, exit_code=self._exit_code)
        else:
            said = self.ssh_errors[-1] if self.ssh_errors else f"ssh exited with {client_code}"
            status = WorkerStatus(WorkerState.EXITED, reason=f"SSH session to {self.host.label} "
                                                             f"ended: {said}")
            self._exit_code = client_code
        with self._lock:
            self.status = status
            callback, self._on_exit = self._on_exit, None
        self._ended.set()
        self._ready.set()  # wake a start() still waiting
        with self._synced:
            self._synced.notify_all()
        if callback is not None and self.pid is not None:
            callback(status)

    # ------------------------------------------------------------ using

    def on_exit(self, callback: ExitCallback) -> None:
        """Call ``callback(status)`` once when the session ends (at once if it has)."""
        with self._lock:
            status = self.status
            if status is None:
                self._on_exit = callback
        if status is not None:
            callback(status)

    def current(self) -> WorkerStatus:
        with self._lock:
            status = self.status
        if status is not None:
            return status
        return WorkerStatus(WorkerState.RUNNING if self.pid else WorkerState.PENDING)

    def send(self, command: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.write(f"{command}\n".encode())
            proc.stdin.flush()

    def stop(self, grace: float) -> bool:
        """SIGTERM the worker, SIGKILL after ``grace``, close the session; True if it ended
        on its own (False: the host did not answer and the local client was killed)."""
        if self._ended.is_set():
            return True
        self.send("term")
        if self._ended.wait(grace):
            return True
        self.send("kill")
        self.close_stdin()
        if self._ended.wait(1.0):
            return True
        self.kill()
        return False

    def close_stdin(self) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    def kill(self) -> None:
        """Kill the local client; the remote wrapper then sees end of input (or, if the host
        is unreachable, its worker exits when the executor falls silent)."""
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        self.close_stdin()
        self._ended.wait(30)

    def sync(self, timeout: float) -> bool:
        """Wait until everything the worker wrote before this call has been read here (the
        wrapper answers through the same output, after it), up to ``timeout``."""
        if self.pid is None or self._ended.is_set():
            return True
        with self._synced:
            self._syncs[1] += 1
            asked = self._syncs[1]
        self.send(f"sync {asked}")
        with self._synced:
            return self._synced.wait_for(
                lambda: self._syncs[0] >= asked or self._ended.is_set(), timeout)

    def tail(self, n: int) -> str:
        lines = list(self.lines)
        return "".join(lines[-n:]) if n > 0 else ""
