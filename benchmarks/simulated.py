"""Lightweight simulated workers: one process that speaks the real protocol on many sockets.

`SimulatedBackend.start_worker` spawns nothing. It hands the spec to a simulator process
(``python -m benchmarks.simulated``, started on first use) that, for each spec, connects to
the executor as a real worker does (the local link's Unix socket, as on the executor's host,
or a TCP stream with ``link="tcp"``, as on another host), does the real HMAC handshake with
the spec's secret, and answers every Tasks message at once with a Results message holding a
pickled ``None`` per task (the arguments are never unpickled). One selector multiplexes
every worker's socket.

    SimulatedBackend (executor's process)          simulator process
      start_worker/stop --- JSON lines on stdin --->  select(stdin + N recv_fds, tick)
      reader thread <------ JSON lines on stdout ---   "running" | "ready" | "exited"

The simulator exits when its stdin closes (the backend closed, or its parent died), when its
parent changes, or after ``max_seconds``, whichever comes first. (Not ``PR_SET_PDEATHSIG``:
it fires when the *thread* that started the child ends, here a launcher thread.)
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from fiberexec import _auth, _contract
from fiberexec import _protocol as p
from fiberexec._errors import LinkClosed, ProtocolError
from fiberexec._link_stream import StreamLink
from fiberexec._serialize import dumps
from fiberexec.backend import (
    Backend,
    ExitListener,
    ExitWatch,
    PermanentBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)

MAX_MESSAGE = 1 << 31
SEND_QUEUE = 1024
SEND_TIMEOUT_MS = 5000
LOG_LINES = 20


def raise_nofile_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit; return the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


# ============================================================================ backend side


class SimulatedBackend(Backend):
    """Workers simulated by one helper process (see the module docstring).

    Args:
        max_seconds: the simulator exits after this long whatever happens.
        link: ``"unix"`` (the local link, as workers on the executor's host connect) or
            ``"tcp"`` (a TCP stream, as workers on other hosts do without TLS).

    Example:
        >>> with SimulatedBackend() as backend:  # doctest: +SKIP
        ...     ex = FiberExecutor(1024, backend=backend, heartbeat=5)
    """

    name = "simulated"

    def __init__(self, *, max_seconds: float = 900.0, link: str = "unix") -> None:
        if link not in ("unix", "tcp"):
            raise ValueError(f"link must be 'unix' or 'tcp', got {link!r}")
        self.max_seconds = max_seconds
        self.link = link
        self._exit_watch = ExitWatch()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()  # the states; never held while the pipe is written
        self._pipe = threading.Lock()  # one command line at a time into the simulator
        self._ready = threading.Condition(self._lock)
        self._states: dict[str, WorkerStatus] = {}
        self._logs: dict[str, deque[str]] = {}
        self.ready_count = 0

    # ------------------------------------------------------------ the seam

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        command = {
            "op": "start",
            "id": spec.worker_id,
            "address": spec.env[_contract.ENV_ADDRESS],
            "local": spec.env.get(_contract.ENV_LOCAL_ADDRESS, ""),
            "link": self.link,
            "secret": spec.secret_env[_contract.ENV_SECRET],
            "nonce": spec.env[_contract.ENV_NONCE],
            "connect_timeout": float(spec.env.get(_contract.ENV_CONNECT_TIMEOUT, "60")),
        }
        with self._lock:
            self._states[spec.worker_id] = WorkerStatus(WorkerState.PENDING)
            self._logs[spec.worker_id] = deque(maxlen=LOG_LINES)
        self._send(command)
        return WorkerHandle(spec.worker_id, f"simulated:{spec.worker_id}")

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        with self._lock:
            return self._states.get(
                handle.worker_id, WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
            )

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        self.unwatch(handle)
        with self._lock:
            status = self._states.get(handle.worker_id)
            if status is None or status.finished:
                return
            self._states[handle.worker_id] = WorkerStatus(
                WorkerState.EXITED, exit_code=-signal.SIGTERM, reason="stopped by the backend"
            )
        with contextlib.suppress(PermanentBackendError):
            self._send({"op": "stop", "id": handle.worker_id})

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        with self._lock:
            lines = list(self._logs.get(handle.worker_id, ()))
        return "".join(f"{line}\n" for line in lines[-tail:])

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        self._exit_watch.watch(handle, listener)
        status = self.status(handle)
        if status.finished:  # it ended before we were asked to watch it
            self._exit_watch.report(handle, status)

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    def simulator_cpu(self) -> float:
        """CPU seconds the simulator process has used so far (0.0 before it starts)."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return 0.0
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_ready(self, count: int, timeout: float) -> bool:
        """Block until ``count`` simulated workers finished their handshake, or ``timeout``."""
        with self._ready:
            return self._ready.wait_for(lambda: self.ready_count >= count, timeout)

    def close(self) -> None:
        for handle in self._exit_watch.clear():
            self.stop(handle, grace=0.5)
        with self._pipe:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)

    # ------------------------------------------------------------ the simulator process

    def _send(self, command: dict[str, Any]) -> None:
        """Write one command line to the simulator (starting it first). Not under the
        states' lock: the simulator may be blocked writing events until the reader thread,
        which takes that lock, reads them (a flood of starts deadlocked so at 4096)."""
        with self._pipe:
            proc = self._proc or self._spawn()
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(command).encode() + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise PermanentBackendError(
                    f"the simulator process is gone (exit code {proc.poll()}); "
                    "see its output on stderr"
                ) from exc

    def _spawn(self) -> subprocess.Popen[bytes]:
        raise_nofile_limit()
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.simulated", str(self.max_seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=root,
            env=env,
            close_fds=True,
        )
        self._reader = threading.Thread(
            target=self._read_events, args=(self._proc,), name="simulated-events", daemon=True
        )
        self._reader.start()
        return self._proc

    def _read_events(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends when the simulator exits
            event = json.loads(line)
            self._on_event(event["ev"], event["id"], event.get("code"), event.get("reason"))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        code = proc.poll()
        with self._lock:
            orphans = [w for w, s in self._states.items() if not s.finished]
        for worker_id in orphans:
            self._on_event("exited", worker_id, code, "the simulator process exited")

    def _on_event(self, kind: str, worker_id: str, code: int | None, reason: str | None) -> None:
        with self._lock:
            if reason:
                self._logs.setdefault(worker_id, deque(maxlen=LOG_LINES)).append(reason)
            old = self._states.get(worker_id)
            if old is None or old.finished:
                return
            if kind == "running":
                self._states[worker_id] = WorkerStatus(WorkerState.RUNNING)
                return
            if kind == "ready":
                self.ready_count += 1
                self._ready.notify_all()
                return
            status = WorkerStatus(WorkerState.EXITED, exit_code=code, reason=reason)
            self._states[worker_id] = status
        self._exit_watch.report(WorkerHandle(worker_id, f"simulated:{worker_id}"), status)


# ============================================================================ simulator side


class Wire:
    """A simulated worker's end of its link (the local link, or a TCP stream): one
    descriptor here, one in the executor."""

    def __init__(self, link: StreamLink) -> None:
        self.link = link
        self.fd = link.sock.fileno()

    def send(self, frame: bytes) -> None:
        self.link.send(frame, SEND_TIMEOUT_MS / 1000)

    def try_recv(self) -> bytes | None:
        return self.link.try_recv()  # raises LinkClosed when the executor hangs up

    def close(self) -> None:
        self.link.close()


def _connect(link: str, local: str, address: str, timeout: float) -> Wire:
    if link == "unix" and local:
        unix = StreamLink.connect(local, MAX_MESSAGE)
        if unix is not None:
            return Wire(unix)
    return Wire(StreamLink.dial(address, MAX_MESSAGE, timeout))


class _SimWorker:
    """One simulated worker: its wire to the executor and where it is in the handshake."""

    def __init__(self, worker_id: str, secret: bytes, executor_nonce: bytes,
                 connect_timeout: float, wire: Wire) -> None:
        self.worker_id = worker_id
        self.secret = secret
        self.connect_timeout = connect_timeout
        self.nonce = _auth.new_nonce()
        self.executor_nonce = executor_nonce
        self.state = "setup"  # -> "ready"
        self.heartbeat = 1.0
        self.created = self.last_recv = self.last_sent = time.monotonic()
        self.wire = wire
        self.fd = wire.fd
        proof = _auth.proof(secret, "worker", self.nonce, executor_nonce)
        # no probe: everything inline
        self.send(p.encode(p.Hello(self.worker_id, self.nonce, os.getpid(), "simulator",
                                   proof, "")))

    def send(self, frame: bytes) -> None:
        self.wire.send(frame)
        self.last_sent = time.monotonic()

    def on_frame(self, frame: bytes, none_payload: Any) -> str | None:
        """Answer one frame; return a reason when this worker should end."""
        self.last_recv = time.monotonic()
        kind = p.peek_kind(frame)
        if self.state == "ready":
            if kind is p.Kind.TASKS:
                tasks = p.decode(frame)
                assert isinstance(tasks, p.Tasks)
                self.send(p.encode(p.Results([
                    p.Result(t.task_id, p.Status.OK, none_payload, 0.0) for t in tasks.tasks
                ])))
            elif kind is p.Kind.BYE:
                return "the executor said goodbye"
            return None
        message = p.decode(frame)
        if self.state == "setup" and isinstance(message, p.Setup):
            expected = _auth.proof(self.secret, "executor", self.nonce, self.executor_nonce)
            if not _auth.verify(expected, message.proof):
                return "the executor failed authentication (wrong secret?)"
            self.heartbeat = message.heartbeat
            self.state = "ready"
        else:
            return f"unexpected {type(message).__name__} while waiting for {self.state}"
        return None

    def overdue(self, now: float) -> str | None:
        """Send a heartbeat if due; return a reason when the executor has gone quiet."""
        if self.state != "ready":
            if now - self.created > self.connect_timeout:
                return f"no handshake within {self.connect_timeout}s"
            return None
        if now - self.last_recv > 3 * self.heartbeat:
            return "the executor fell silent"
        if now - self.last_sent >= self.heartbeat:
            self.send(p.encode(p.Heartbeat()))
        return None


class _Simulator:
    """The simulator's loop: control commands on stdin, frames on every worker's socket."""

    TICK = 0.25

    def __init__(self, control: IO[bytes], events: IO[bytes], max_seconds: float) -> None:
        self.control_fd = control.fileno()
        self.events = events
        self.deadline = time.monotonic() + max_seconds
        self.parent = os.getppid()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.control_fd, selectors.EVENT_READ, None)
        self.workers: dict[str, _SimWorker] = {}
        self.removed: deque[str] = deque()
        self.pending = b""
        self.none_payload = dumps(None)
        self.running = True

    def run(self) -> None:
        next_tick = time.monotonic() + self.TICK
        while self.running and time.monotonic() < self.deadline:
            timeout = max(0.0, next_tick - time.monotonic())
            for key, _ in self.selector.select(timeout):
                if key.data is None:
                    self._read_control()
                else:
                    self._drain(key.data)
            self._reap_removed()
            if time.monotonic() >= next_tick:
                self._tick()
                next_tick = time.monotonic() + self.TICK
        for worker_id in list(self.workers):
            self._end(worker_id, 0, "the simulator is exiting")

    def _read_control(self) -> None:
        chunk = os.read(self.control_fd, 1 << 16)
        if not chunk:  # the backend closed us, or our parent died
            self.running = False
            return
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            command = json.loads(line)
            if command["op"] == "start":
                self._start(command)
            elif command["op"] == "stop":
                self._end(command["id"], -signal.SIGTERM, "stopped by the backend")

    def _start(self, command: dict[str, Any]) -> None:
        worker_id = command["id"]
        try:
            wire = _connect(command["link"], command["local"], command["address"],
                            float(command["connect_timeout"]))
            worker = _SimWorker(worker_id, _auth.secret_from_hex(command["secret"]),
                                _auth.nonce_from_hex(command["nonce"]),
                                float(command["connect_timeout"]), wire)
        except (LinkClosed, OSError) as exc:
            self._emit("exited", worker_id, code=1,
                       reason=f"cannot connect to {command['address']}: {exc}")
            return
        self.workers[worker_id] = worker
        self.selector.register(worker.fd, selectors.EVENT_READ, worker)
        self._emit("running", worker_id)

    def _drain(self, worker: _SimWorker) -> None:
        for _ in range(SEND_QUEUE):  # bounded: come back to the others after this many
            try:
                frame = worker.wire.try_recv()
            except LinkClosed:
                self.removed.append(worker.worker_id)
                return
            if frame is None:
                return
            was_ready = worker.state == "ready"
            try:
                reason = worker.on_frame(frame, self.none_payload)
            except (ProtocolError, LinkClosed) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                self._end(worker.worker_id, 0 if "goodbye" in reason else 1, reason)
                return
            if worker.state == "ready" and not was_ready:
                self._emit("ready", worker.worker_id)

    def _reap_removed(self) -> None:
        while self.removed:
            worker_id = self.removed.popleft()
            if worker_id in self.workers:
                self._end(worker_id, 0, "the connection to the executor closed")

    def _tick(self) -> None:
        if os.getppid() != self.parent:
            self.running = False
            return
        now = time.monotonic()
        for worker_id, worker in list(self.workers.items()):
            try:
                reason = worker.overdue(now)
            except LinkClosed as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                self._end(worker_id, 1, reason)

    def _end(self, worker_id: str, code: int, reason: str) -> None:
        worker = self.workers.pop(worker_id, None)
        if worker is None:
            return
        self.selector.unregister(worker.fd)
        worker.wire.close()
        self._emit("exited", worker_id, code=code, reason=reason)

    def _emit(self, kind: str, worker_id: str, **fields: object) -> None:
        line = json.dumps({"ev": kind, "id": worker_id, **fields}).encode() + b"\n"
        try:
            self.events.write(line)
            self.events.flush()
        except BrokenPipeError:
            self.running = False


def main() -> None:
    max_seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 900.0
    raise_nofile_limit()
    _Simulator(sys.stdin.buffer, sys.stdout.buffer, max_seconds).run()


if __name__ == "__main__":
    main()
