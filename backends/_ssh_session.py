"""One SSH session per host: the system ``ssh`` client running the host wrapper.

::

    Popen(ssh ... host 'exec python -c LOADER fiberexec-ssh-host EXECUTOR')
      stdin  --> framed JSON: the wrapper's code and settings, then spawn (env, secret,
                 argv, workdir, limits), signal, sync and ping requests (one writer thread);
                 closing it (or this process dying, or no ping for the watchdog period)
                 ends every worker of the host
      stdout <-- "#fiberexec-ssh {...}" reports (hello, error, spawned, failed, exit, note,
                 synced) and "#fiberexec-out N line": worker N's output
      stderr <-- ssh's own complaints (refused, host key, timeout)

`HostSession` is the session; a `Remote` is one worker in it, numbered there. The stdout
reader hands each line to its worker and settles each worker's `WorkerStatus` (its exit
code, or the session's end) once, calling its exit callbacks. Failures before the wrapper
said ``hello`` become `TransientBackendError` (the network or sshd may recover) or
`PermanentBackendError` (refused keys, unknown host key, no Python, no fiberexec), each
naming the host and the fix; `classify` is the one place that decides.
"""

from __future__ import annotations

import contextlib
import json
import queue
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


KILL_ANSWER = 5.0  # seconds a host has to report a SIGKILLed worker gone before its session is cut


class Remote:
    """One worker in a host session: its number there, its pid, output and end."""

    def __init__(self, session: HostSession, n: int, worker_id: str) -> None:
        self.session = session
        self.host = session.host
        self.n = n
        self.worker_id = worker_id
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)
        self.pid: int | None = None
        self.notes: list[str] = []
        self.status: WorkerStatus | None = None
        self.failure: tuple[str, bool] | None = None  # why it could not start, transient?
        self.abandoned = False  # its start timed out: kill it should it start after all
        self.answered = threading.Event()  # spawned, failed, or the session ended
        self._ended = threading.Event()
        self._callbacks: list[ExitCallback] = []
        self._lock = threading.Lock()

    def settle(self, status: WorkerStatus) -> None:
        with self._lock:
            if self.status is not None:
                return
            self.status = status
            callbacks, self._callbacks = self._callbacks, []
        self._ended.set()
        self.answered.set()
        if self.pid is not None:
            for callback in callbacks:
                callback(status)

    def on_exit(self, callback: ExitCallback) -> None:
        """Call ``callback(status)`` once when the worker ends (at once if it has)."""
        with self._lock:
            status = self.status
            if status is None:
                self._callbacks.append(callback)
        if status is not None:
            callback(status)

    def current(self) -> WorkerStatus:
        with self._lock:
            status = self.status
        if status is not None:
            return status
        return WorkerStatus(WorkerState.RUNNING if self.pid else WorkerState.PENDING)

    def stop(self, grace: float) -> bool:
        """SIGTERM the worker, SIGKILL after ``grace``; True if the host reported its end
        (False: it did not, and the host's session was cut)."""
        if self._ended.is_set():
            return True
        self.session.signal(self.n, "term")
        if self._ended.wait(grace):
            return True
        self.session.signal(self.n, "kill")
        if self._ended.wait(KILL_ANSWER):
            return True
        self.session.kill()  # the host does not answer: its other workers end with it
        return False

    def sync(self, timeout: float) -> bool:
        """Wait until everything the worker wrote before this call has been read here."""
        if self.pid is None or self._ended.is_set():
            return True
        return self.session.sync(timeout)

    def tail(self, n: int) -> str:
        lines = list(self.lines)
        return "".join(lines[-n:]) if n > 0 else ""


class HostSession:
    """The ssh client process of one host, and the workers it started there."""

    def __init__(self, host: SSHHost, argv: Sequence[str], hello: dict[str, Any]) -> None:
        self.host = host
        self.argv = list(argv)
        self.users = 0  # workers running or starting here; the backend counts them
        self.taught: set[str] = set()  # installed modules named to its launcher so far
        self.ssh_errors: deque[str] = deque(maxlen=50)
        self._remotes: dict[int, Remote] = {}  # those not ended, by number
        self._next = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._writes: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # the wrapper's first frame must be the hello (it carries the code the loader runs):
        # queued now, before any other thread can ping or signal this session
        self._writes.put(frame({"code": _CODE, **hello}))
        self._launched = False
        self._launch_error: BackendError | None = None
        self._greeted = False
        self._opened = threading.Event()  # hello, or the end
        self._ended = threading.Event()
        self._error: dict[str, Any] | None = None
        self._exit_code: int | None = None
        self._lock = threading.Lock()
        self._stderr_reader: threading.Thread | None = None
        self._synced = threading.Condition()  # `sync`: answers seen, and asked
        self._syncs = [0, 0]

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    @property
    def greeted(self) -> bool:
        return self._greeted

    @property
    def client_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ------------------------------------------------------------ opening

    def open(self, worker_id: str, timeout: float) -> None:
        """Run ssh (the first caller does) and wait for the wrapper's ``hello``."""
        with self._lock:
            first, self._launched = not self._launched, True
        if first:
            self._launch()
        self._opened.wait(timeout)
        if self._launch_error is not None:
            raise self._launch_error
        if self._greeted and not self._ended.is_set():
            return
        if not self._ended.is_set():
            self.kill()
            raise TransientBackendError(
                f"cannot start worker {worker_id} on ssh host {self.host.label}: no answer "
                f"within {timeout:.0f}s ({' '.join(self.ssh_errors) or 'ssh said nothing'})")
        raise classify(self.host, self._exit_code if self._exit_code is not None else -1,
                       "\n".join(self.ssh_errors), self._error, worker_id)

    def _launch(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as exc:
            self._launch_error = PermanentBackendError(
                f"cannot start workers on ssh host {self.host.label}: the ssh client "
                f"{self.argv[0]!r} cannot run ({exc}); install openssh-client or pass ssh=")
            self._ended.set()
            self._opened.set()
            return
        threading.Thread(target=self._write, name="fiberexec-ssh-in", daemon=True).start()
        self._stderr_reader = threading.Thread(
            target=self._read_stderr, name="fiberexec-ssh-err", daemon=True)
        self._stderr_reader.start()
        threading.Thread(target=self._read_stdout, name="fiberexec-ssh-out", daemon=True).start()

    def _write(self) -> None:
        """The one writer of ssh's stdin: a dead link blocks this thread only."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        while (data := self._writes.get()) is not None:
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except (OSError, ValueError):
                break
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()

    # ------------------------------------------------------------ workers

    def spawn(self, worker_id: str, message: dict[str, Any], timeout: float) -> Remote:
        """Ask the wrapper for a worker; its `Remote` once the host reports its pid."""
        with self._lock:
            n, self._next = self._next, self._next + 1
            worker = Remote(self, n, worker_id)
            self._remotes[n] = worker
        if not self._ended.is_set():
            self._send({"op": "spawn", "n": n, **message})
        else:
            worker.settle(self._end_status())
        where = f"cannot start worker {worker_id} on ssh host {self.host.label}"
        if not worker.answered.wait(timeout):
            worker.abandoned = True
            self.signal(n, "kill")  # in case it starts after all
            raise TransientBackendError(f"{where}: the host did not start it within "
                                        f"{timeout:.0f}s")
        if worker.pid is not None:
            return worker
        if worker.failure is not None:
            why, transient = worker.failure
            error = TransientBackendError if transient else PermanentBackendError
            raise error(f"{where}: {why}")
        raise TransientBackendError(f"{where}: {self._end_status().reason}")

    def signal(self, n: int, which: str) -> None:
        self._send({"op": "signal", "n": n, "sig": which})

    def ping(self) -> None:
        if self._writes.empty():  # a backlog already tells the wrapper we are here
            self._send({"op": "ping"})

    def _send(self, message: dict[str, Any]) -> None:
        if not self._ended.is_set():
            self._writes.put(frame(message))

    def sync(self, timeout: float) -> bool:
        """Wait until everything this host's workers wrote before the call has been read
        here (the wrapper reads their output dry, then answers), up to ``timeout``."""
        with self._synced:
            self._syncs[1] += 1
            asked = self._syncs[1]
        self._send({"op": "sync", "k": asked})
        with self._synced:
            return self._synced.wait_for(
                lambda: self._syncs[0] >= asked or self._ended.is_set(), timeout)

    # ------------------------------------------------------------ reading

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            text = raw.decode(errors="replace").rstrip("\n")
            self.ssh_errors.append(text)
            self._to_all(f"ssh: {text}\n")

    def _read_stdout(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        out_tag, tag = remote.OUT_TAG.encode(), remote.TAG.encode()
        for raw in proc.stdout:
            if raw.startswith(out_tag):
                number, _, text = raw[len(out_tag):].partition(b" ")
                worker = self._remotes.get(int(number)) if number.isdigit() else None
                if worker is not None:
                    worker.lines.append(text.decode(errors="replace"))
            elif raw.startswith(tag):
                self._on_report(raw[len(tag):].decode(errors="replace"))
            else:
                self._to_all(raw.decode(errors="replace"))
        self._finish(proc)

    def _finish(self, proc: subprocess.Popen[bytes]) -> None:
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
        self._writes.put(None)
        self._exit_code = code
        self._ended.set()
        self._opened.set()
        with self._lock:
            workers, self._remotes = list(self._remotes.values()), {}
        status = self._end_status()
        for worker in workers:
            worker.settle(status)
        with self._synced:
            self._synced.notify_all()

    def _end_status(self) -> WorkerStatus:
        said = self.ssh_errors[-1] if self.ssh_errors else f"ssh exited with {self._exit_code}"
        return WorkerStatus(WorkerState.EXITED,
                            reason=f"SSH session to {self.host.label} ended: {said}")

    def _to_all(self, line: str) -> None:
        for worker in list(self._remotes.values()):
            worker.lines.append(line)

    def _on_report(self, text: str) -> None:
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            self._to_all(remote.TAG + text)
            return
        kind = event.get("event")
        worker = self._remotes.get(int(event.get("n", -1)))
        if kind == "hello":
            self._greeted = True
            self._opened.set()
        elif kind == "error":
            self._error = event
        elif kind == "note":
            self._to_all(f"fiberexec-ssh: {event.get('text')}\n")
        elif kind == "synced":
            with self._synced:
                self._syncs[0] = max(self._syncs[0], int(event["k"]))
                self._synced.notify_all()
        elif worker is not None:
            self._on_worker_report(kind, worker, event)

    def _on_worker_report(self, kind: str, worker: Remote, event: dict[str, Any]) -> None:
        if kind == "spawned":
            worker.pid = int(event["pid"])
            worker.notes = [str(n) for n in event.get("notes", [])]
            worker.answered.set()
            if worker.abandoned:
                self.signal(worker.n, "kill")
        elif kind == "failed":
            worker.failure = (str(event.get("why")), bool(event.get("transient")))
            with self._lock:
                self._remotes.pop(worker.n, None)
            worker.answered.set()
        elif kind == "exit":
            with self._lock:
                self._remotes.pop(worker.n, None)
            worker.settle(WorkerStatus(WorkerState.EXITED, exit_code=int(event["code"])))

    # ------------------------------------------------------------ ending

    def close(self) -> None:
        """Close the wrapper's input: it ends every worker still there, then exits."""
        self._writes.put(None)

    def shutdown(self, timeout: float) -> bool:
        """`close`, then wait for the session to end; kill the local client after
        ``timeout``. True if the host answered."""
        self.close()
        if self._ended.wait(timeout):
            return True
        self.kill()
        return False

    def kill(self) -> None:
        """Kill the local client; the host wrapper then sees end of input (or, if the host
        is unreachable, its workers exit when the executor falls silent)."""
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        self._writes.put(None)
        self._ended.wait(30)
