"""A conformance kit for backends: the seam's contract, written once, run against any backend.

Call the checkers from your own test suite with a `Harness` that says how to make a fresh
backend (as ``trio.testing.check_one_way_stream`` takes a stream maker)::

    from fiberexec.testing import Harness, check_backend

    def test_my_backend_keeps_the_contract() -> None:
        check_backend(Harness(make_backend=lambda: SlurmBackend(partition="debug")))

Each checker starts real workers (small ``python -c`` programs, started exactly as the backend
starts ``python -m fiberexec.worker``), waits on `Backend.watch` reports and on loopback
connections the workers open (no polling, every wait bounded by ``Harness.timeout``), closes
every backend it made, and raises `AssertionError` naming the broken rule. The contract:

* exit codes reach `watch` (once per worker, also when asked after the exit) and `status`;
* a worker killed by signal N reports exit code -N; over its memory limit, ``OOMKilled``;
* an unknown handle: `status` is UNKNOWN, `logs` is ``""``, `stop` is a no-op; none raises;
* `stop` ends the worker and is not reported as an exit; stopping again is a no-op;
* `close` stops every worker the backend started;
* ``remove_stray`` keeps live executors' workers (their lease is held), stops one executor's
  workers when named and spares the others', lists without removing in a dry run, and (when
  the harness can make a lease lapse) stops the workers of an executor that is gone;
* `logs` returns the last lines a worker wrote.

Workers dial back to ``Backend.bind_host``/``advertise_host`` (loopback for the built-in
backends), so the checking process must be reachable there, as an executor would be.
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fiberexec.backend import (
    ENV_ADDRESS,
    ENV_CONNECT_TIMEOUT,
    ENV_EXECUTOR_ID,
    ENV_NONCE,
    ENV_SECRET,
    ENV_WORKER_ID,
    WORKER_COMMAND,
    Backend,
    Resources,
    Sweep,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)

__all__ = [
    "CHECKS",
    "Harness",
    "check_backend",
    "check_close",
    "check_exit_codes",
    "check_logs",
    "check_remove_stray",
    "check_signals",
    "check_stop",
    "check_unknown_handle",
    "check_watch_reports_once",
]


@dataclass(frozen=True)
class Harness:
    """How to run the contract against one backend.

    Args:
        make_backend: a fresh backend; the checkers close every one they make.
        image: put in every spec (for backends that need one and have no default).
        timeout: seconds any single expected event (an exit, a connection) may take.
        memory_limits: the backend enforces ``Resources.memory`` (a worker over it is killed
            and reported ``OOMKilled``); False skips that part of `check_signals`.
        logs_after_exit: `logs` still returns a worker's output after it exited (False for a
            backend whose jobs vanish with their output, as auto-removed containers may).
        remove_stray: how to call the backend's ``remove_stray`` with a `Sweep` (default:
            the class method, which finds the engine or cluster as the ``fiberexec`` command
            would).
        abandon: ``abandon(backend, executor_id)`` makes that executor look dead: its lease
            goes, its workers keep running (as after a SIGKILL, before they notice); None
            skips that part of `check_remove_stray`.
    """

    make_backend: Callable[[], Backend]
    image: str | None = None
    timeout: float = 30.0
    memory_limits: bool = False
    logs_after_exit: bool = True
    remove_stray: Callable[[Backend, Sweep], object] | None = None
    abandon: Callable[[Backend, str], None] | None = None
    executor_id: str = field(default_factory=lambda: f"conformance-{secrets.token_hex(4)}")


class _Exits:
    """A watch listener whose reports a checker takes one at a time, with a bound."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._queue: queue.Queue[tuple[str, WorkerStatus]] = queue.Queue()

    def __call__(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        self._queue.put((handle.worker_id, status))

    def next(self) -> tuple[str, WorkerStatus]:
        try:
            return self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise AssertionError(f"watch reported no exit within {self.timeout}s") from None

    def none_within(self, seconds: float) -> bool:
        try:
            self._queue.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


class _Session:
    """Backends made for one check, a spec factory, and a listening socket workers dial."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.backends: list[Backend] = []
        self._ids = iter(range(1_000_000))

    def backend(self) -> Backend:
        made = self.harness.make_backend()
        self.backends.append(made)
        return made

    def worker_id(self) -> str:
        return f"w{next(self._ids)}"

    def spec(self, code: str, *, resources: Resources | None = None) -> WorkerSpec:
        return WorkerSpec(worker_id=self.worker_id(), executor_id=self.harness.executor_id,
                          command=("python", "-c", code), image=self.harness.image,
                          resources=resources or Resources())

    def close(self) -> None:
        for made in self.backends:
            made.close()


@contextlib.contextmanager
def _session(harness: Harness) -> Iterator[_Session]:
    session = _Session(harness)
    try:
        yield session
    finally:
        session.close()


class _Line:
    """A loopback listener: a worker that connects says "I run"; EOF says "I am gone"."""

    def __init__(self, backend: Backend, timeout: float) -> None:
        self.timeout = timeout
        self._server = socket.create_server((backend.bind_host, 0))
        self._server.settimeout(timeout)
        self.host, self.port = backend.advertise_host, self._server.getsockname()[1]
        self._conns: list[socket.socket] = []

    def program(self, then: str = "import time; time.sleep(600)") -> str:
        """Python that prints two lines, dials this line, then runs ``then``."""
        return (f"import socket; print('one'); print('two', flush=True); "
                f"c = socket.create_connection(({self.host!r}, {self.port})); "
                f"c.sendall(b'up'); {then}")

    def accept(self) -> socket.socket:
        try:
            conn, _ = self._server.accept()
        except TimeoutError:
            raise AssertionError(f"no worker dialed back within {self.timeout}s") from None
        conn.settimeout(self.timeout)
        assert conn.recv(2) == b"up"
        self._conns.append(conn)
        return conn

    def assert_gone(self, conn: socket.socket, rule: str) -> None:
        try:
            data = conn.recv(1)
        except TimeoutError:
            raise AssertionError(f"{rule}: the worker still runs after {self.timeout}s") from None
        except ConnectionResetError:
            data = b""
        assert data == b"", f"{rule}: the worker sent {data!r} instead of going away"

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._server.close()


@contextlib.contextmanager
def _line(backend: Backend, timeout: float) -> Iterator[_Line]:
    line = _Line(backend, timeout)
    try:
        yield line
    finally:
        line.close()


# -- the checks ------------------------------------------------------------------------------


def check_exit_codes(harness: Harness) -> None:
    """Each worker's exit code reaches `watch` once, and `status` agrees afterwards."""
    with _session(harness) as s:
        backend, exits = s.backend(), _Exits(harness.timeout)
        handles = {}
        for code in (0, 1, 3, 101):
            handle = backend.start_worker(s.spec(f"raise SystemExit({code})"))
            backend.watch(handle, exits)
            handles[handle.worker_id] = (handle, code)
        reports = [exits.next() for _ in handles]
        assert sorted(w for w, _ in reports) == sorted(handles), (
            f"watch must report each worker exactly once, got {reports}")
        reported = dict(reports)
        for worker_id, (handle, code) in handles.items():
            expected = WorkerStatus(WorkerState.EXITED, exit_code=code)
            assert reported[worker_id] == expected, (
                f"exit code {code}: watch reported {reported[worker_id]}")
            status = backend.status(handle)
            assert (status.state, status.exit_code) == (WorkerState.EXITED, code), (
                f"exit code {code}: status() says {status} after the exit was reported")
        assert exits.none_within(0.2), "watch reported a worker more than once"


def check_watch_reports_once(harness: Harness) -> None:
    """`watch` on a worker that already exited reports at once, exactly once."""
    with _session(harness) as s:
        backend, first = s.backend(), _Exits(harness.timeout)
        handle = backend.start_worker(s.spec("raise SystemExit(5)"))
        backend.watch(handle, first)
        assert first.next()[1].exit_code == 5
        late = _Exits(harness.timeout)
        backend.watch(handle, late)
        assert late.next()[1].exit_code == 5, "watch after the exit reported another code"
        assert late.none_within(0.2), "watch after the exit reported more than once"


def check_signals(harness: Harness) -> None:
    """A worker killed by signal N reports exit code -N; over its memory limit, OOMKilled."""
    with _session(harness) as s:
        backend, exits = s.backend(), _Exits(harness.timeout)
        for sig in (signal.SIGKILL, signal.SIGTERM):
            code = f"import os, signal; os.kill(os.getpid(), signal.{sig.name})"
            backend.watch(backend.start_worker(s.spec(code)), exits)
            status = exits.next()[1]
            assert (status.state, status.exit_code) == (WorkerState.EXITED, -sig), (
                f"a worker killed by {sig.name} must report exit code {-sig}, got {status}")
        if harness.memory_limits:
            hog = "b = bytearray(512 * 2**20); print('survived')"  # zero-filled: all touched
            spec = s.spec(hog, resources=Resources(memory=64 * 2**20))
            backend.watch(backend.start_worker(spec), exits)
            status = exits.next()[1]
            assert (status.exit_code, status.reason) == (-signal.SIGKILL, "OOMKilled"), (
                f"a worker over its memory limit must report (-9, 'OOMKilled'), got {status}")


def check_unknown_handle(harness: Harness) -> None:
    """A handle the backend never started: UNKNOWN status, empty logs, stop a no-op."""
    with _session(harness) as s:
        backend = s.backend()
        handle = WorkerHandle("no-such-worker", "0" * 63)
        status = backend.status(handle)
        assert status.state is WorkerState.UNKNOWN, f"status of an unknown handle: {status}"
        assert backend.logs(handle) == "", "logs of an unknown handle must be empty"
        backend.stop(handle, grace=0.5)
        started = backend.start_worker(s.spec("pass"))  # also after the backend is in use
        backend.stop(started, grace=0.5)
        assert backend.status(handle).state is WorkerState.UNKNOWN


def check_stop(harness: Harness) -> None:
    """`stop` ends the worker and is not reported as an exit; stopping again is a no-op."""
    with _session(harness) as s:
        backend, exits = s.backend(), _Exits(harness.timeout)
        with _line(backend, harness.timeout) as line:
            handle = backend.start_worker(s.spec(line.program()))
            backend.watch(handle, exits)
            conn = line.accept()
            assert not backend.status(handle).finished, "status of a worker that runs"
            backend.stop(handle, grace=1.0)
            line.assert_gone(conn, "stop() must end the worker")
            assert backend.status(handle).finished, "status after stop() must be finished"
            assert exits.none_within(0.5), "a stopped worker must not be reported by watch"
            backend.stop(handle, grace=1.0)


def check_close(harness: Harness) -> None:
    """`close` stops every worker the backend started, running or not yet watched."""
    with _session(harness) as s:
        backend = s.backend()
        with _line(backend, harness.timeout) as line:
            handles = [backend.start_worker(s.spec(line.program())) for _ in range(3)]
            backend.watch(handles[0], _Exits(harness.timeout))
            conns = [line.accept() for _ in handles]
            backend.close()
            for conn in conns:
                line.assert_gone(conn, "close() must stop every worker")
            backend.close()  # idempotent


def check_remove_stray(harness: Harness) -> None:
    """``remove_stray`` removes only what its `Sweep` picks.

    A bare sweep spares live executors' workers; a dry run of everything names them and
    removes nothing; naming an executor stops its workers and spares the others'; once an
    executor's lease lapses (``Harness.abandon``), a bare sweep stops its workers. The
    workers are real ``python -m fiberexec.worker`` processes dialing a port nothing
    listens on, so only a removal ends them within the check.
    """
    with _session(harness) as s:
        victims, bystanders = s.backend(), s.backend()
        gone, other = f"{harness.executor_id}-gone", f"{harness.executor_id}-other"
        exits = _Exits(harness.timeout)
        victim = victims.start_worker(_stray_spec(s, gone, victims))
        spared = bystanders.start_worker(_stray_spec(s, other, bystanders))
        victims.watch(victim, exits)
        bystanders.watch(spared, exits)
        call = harness.remove_stray or (lambda b, sweep: type(b).remove_stray(sweep))
        call(victims, Sweep())
        assert exits.none_within(1.0), "remove_stray() stopped a live executor's worker"
        listed = "\n".join(str(line) for line in _lines(call(victims, Sweep(everything=True,
                                                                        dry_run=True))))
        assert gone in listed and other in listed, (
            f"a dry run of everything must name every executor's workers; it said:\n{listed}")
        assert exits.none_within(0.5), "a dry run stopped a worker"
        call(victims, Sweep(executor_id=gone))
        _expect_exit(exits, victim, "remove_stray(executor_id)")
        assert exits.none_within(0.5), "remove_stray stopped another executor's worker"
        assert bystanders.status(spared).state in (WorkerState.RUNNING, WorkerState.PENDING)
        if harness.abandon is not None:
            harness.abandon(bystanders, other)
            call(bystanders, Sweep())
            _expect_exit(exits, spared, "remove_stray() after its executor's lease lapsed")


def _lines(result: object) -> list[object]:
    return list(result) if isinstance(result, list | tuple) else [result]


def _expect_exit(exits: _Exits, handle: WorkerHandle, what: str) -> None:
    worker_id, status = exits.next()
    assert worker_id == handle.worker_id, f"{what} stopped another executor's worker"
    assert status.finished


def _stray_spec(s: _Session, executor_id: str, backend: Backend) -> WorkerSpec:
    """The real worker program, dialing a port nothing listens on: its executor is gone."""
    with socket.create_server((backend.bind_host, 0)) as closed:  # bound, never listened on
        port = closed.getsockname()[1]
    worker_id = s.worker_id()
    env = {ENV_ADDRESS: f"tcp://{backend.advertise_host}:{port}", ENV_WORKER_ID: worker_id,
           ENV_EXECUTOR_ID: executor_id, ENV_NONCE: secrets.token_hex(16),
           ENV_CONNECT_TIMEOUT: str(max(60.0, 4 * s.harness.timeout))}
    return WorkerSpec(worker_id=worker_id, executor_id=executor_id, command=WORKER_COMMAND,
                      image=s.harness.image, env=env,
                      secret_env={ENV_SECRET: secrets.token_hex(32)})


def check_logs(harness: Harness) -> None:
    """`logs` returns a worker's last lines while it runs (and after it exited, if kept)."""
    with _session(harness) as s:
        backend, exits = s.backend(), _Exits(harness.timeout)
        with _line(backend, harness.timeout) as line:
            handle = backend.start_worker(s.spec(line.program(then="c.recv(1)")))
            backend.watch(handle, exits)
            conn = line.accept()
            assert backend.logs(handle, tail=1) == "two\n", (
                f"logs(tail=1) while running: {backend.logs(handle, tail=1)!r}")
            assert backend.logs(handle, tail=2) == "one\ntwo\n"
            conn.sendall(b"x")  # let it exit
            assert exits.next()[1].exit_code == 0
            if harness.logs_after_exit:
                assert backend.logs(handle) == "one\ntwo\n", (
                    f"logs after the exit: {backend.logs(handle)!r}")


#: Every check, by name, in the order `check_backend` runs them.
CHECKS: dict[str, Callable[[Harness], None]] = {
    "exit_codes": check_exit_codes,
    "watch_reports_once": check_watch_reports_once,
    "signals": check_signals,
    "unknown_handle": check_unknown_handle,
    "stop": check_stop,
    "close": check_close,
    "remove_stray": check_remove_stray,
    "logs": check_logs,
}


def check_backend(harness: Harness) -> None:
    """Run every check of the contract against the harness's backend."""
    for check in CHECKS.values():
        check(harness)
