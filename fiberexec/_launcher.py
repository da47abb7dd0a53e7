"""The forking launcher: workers start at fork's pace and share the launcher's pages.

Backends that start several workers on one host use it through `fiberexec.backend` (the
local backend does). One launcher process per program (`SharedLaunchers`) imports the
worker program once (with
cloudpickle, which a function of the user's script needs to be rebuilt, and the modules
named in ``FIBEREXEC_PRELOAD``), then forks each worker from itself, as the
standard library's forkserver does: a worker starts in milliseconds, shares the launcher's
memory pages, and nothing is forked from the user's own process (its threads and locks
stay where they are).

    executor (a backend)                         launcher: python -m fiberexec.worker --launcher
    Launcher.spawn --("spawn", env delta, ...)-> fork -> child: waits at the gate (`_Gate`),
                     + stdout, stderr                    then setpgid, env, cwd, limits,
                                                         output, then its program:
               <--("spawned", pid) + pidfd--             fiberexec.worker.run(), or another
    reader thread <--("exited", pid, code)--             of fiberexec's as ``python -m`` would
                                                 SIGCHLD -> waitpid -> report

Installed modules that workers on this host imported are imported by the launcher before
its next fork (`fiberexec._imports`), so workers started later begin with them; a request
whose environment differs by more than fiberexec's own variables goes to a second launcher
that learns nothing (`Launcher.spawn`).

A program other than the worker (``program=``: a module of fiberexec with a ``main()``, such
as the one a `fiberexec.multiprocessing.Process` runs) is imported by the launcher the first
time it is asked for, so every child after that starts with it loaded; the child makes it
its ``__main__`` and calls its ``main()``, as ``python -m`` would. A child writes
to the standard output and error its requester has at the time it asks (passed along with
the request), as a child started afresh would, unless it logs to a file or its requester
hands it a descriptor of its own (a pipe the ssh host wrapper reads, to tag its output).

The two talk over a private ``SOCK_SEQPACKET`` socket pair (one message per datagram, the
child's pidfd passed along, so a signal never reaches a recycled pid). When the program
ends, the launcher's socket closes and it exits; its workers leave on their own as their
connections to their executors close. A forked worker's command line is the launcher's, so
process listings and ``fiberexec cleanup`` still see ``python -m fiberexec.worker``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import os
import pickle
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fiberexec import _imports, _procstate, _threads
from fiberexec._fdlimit import readable_within

# fiberexec's own variables, which a request may change freely (what the executor tells a
# worker; a `fiberexec.multiprocessing.Pool` marks its workers with _FIBER_POOL_PARENT)
OWN_PREFIXES = ("FIBEREXEC_", "_FIBER_")
ENV_PRELOAD = "FIBEREXEC_PRELOAD"  # comma-separated modules the launcher imports up front
# What a forked child's /proc/<pid>/environ names, as a worker started afresh names them
# (``fiberexec cleanup`` reads them): the launcher starts with room for each, which a child
# fills with its own (see `_shown_as`).
SHOWN = ("FIBEREXEC_EXECUTOR_ID", "FIBEREXEC_WORKER_ID")
SHOWN_WIDTH = 64
LAUNCHER_FLAG = "--launcher"
MAX_MESSAGE = 1 << 20
SPAWN_TIMEOUT = 30.0
GATE_HOLD = 3.0  # seconds children forked back to back wait at most for the rest (`_Gate`)
GATE_QUIET_MS = 5  # within a burst, no request for this long: the gate opens
GATE_BATCH = 8  # a burst's children that start at once, before the gate holds the rest
WORKER_PROGRAM = "fiberexec.worker"
# Signals the worker program handles itself, whatever its requester has them set to (a
# stop's SIGTERM, an interrupt's SIGINT; off the terminal: SIGTTOU, SIGTTIN)
WORKER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGTTOU, signal.SIGTTIN)


class LauncherError(OSError):
    """The launcher could not fork a worker, or is gone."""


class ForkedProcess:
    """A worker forked by the launcher, with the parts of `subprocess.Popen` the backend uses."""

    def __init__(self, pid: int, pidfd: int, on_exit: Listener | None = None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._on_exit = on_exit
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def exited(self, code: int) -> None:
        with self._lock:
            self.returncode = code
            os.close(self._pidfd)
        self._exited.set()
        if self._on_exit is not None:
            self._on_exit(self)


Listener = Callable[[ForkedProcess], None]


class Launcher:
    """The executor's side: starts the launcher process, asks it for workers, hears exits."""

    def __init__(self, python: str, env: Mapping[str, str],
                 on_exit: Callable[[ForkedProcess], None] | None = None,
                 flags: Sequence[str] = (), *, learns: bool = True) -> None:
        """``flags``: the interpreter's options (``-O``, ``-W error``...), which every child
        forked from it then has. ``on_exit`` hears each child's exit, unless its `spawn`
        names a listener of its own. ``learns``: it imports the modules workers on this
        host imported (`fiberexec._imports`) before the forks that follow."""
        self._python, self._flags, self.learns = python, tuple(flags), learns
        self._taught: set[str] = set()  # the learned modules sent to it
        self._twin: Launcher | None = None  # forks what it must not, once it learned some
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**env, **dict.fromkeys(SHOWN, " " * SHOWN_WIDTH)}
        self._env = env  # the launcher's own: a request carries what differs from it
        self._sock = ours
        self._on_exit = on_exit
        try:
            self.proc = subprocess.Popen(
                [python, *flags, "-m", "fiberexec.worker", LAUNCHER_FLAG, str(theirs.fileno())],
                env=dict(env), stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                process_group=0)  # out of the terminal's reach, in the caller's session
        finally:
            theirs.close()
        # each request's reply slot and exit listener, in request order
        self._waiting: deque[tuple[queue.SimpleQueue[tuple[Any, ...]], Listener | None]] = deque()
        self._children: dict[int, ForkedProcess] = {}
        self.forked = 0  # processes it forked: a launcher that did, then went, was killed
        self.gone = False  # its end of the socket closed: it exited (or is exiting)
        self._lock = threading.Lock()  # a request's send and its place in `_waiting` together
        self._last_ask = 0.0  # when the last request was sent (monotonic)
        self._reader = threading.Thread(target=self._read, name="fiberexec-local-launcher",
                                        daemon=True)
        self._reader.start()

    def spawn(self, *, env: Mapping[str, str], cwd: str, memory: int | None,
              log: str | None, program: str = WORKER_PROGRAM,
              output: int | None = None, group: int | None = None,
              on_exit: Listener | None = None) -> ForkedProcess:
        """Fork a worker (or another of fiberexec's programs, by module name). Several
        threads may ask at once: their requests are pipelined (the launcher forks them back
        to back), and replies come back in order. The child writes to the file ``log``,
        else to the descriptor ``output`` (standard output and error both), else to ours.
        It starts a process group of its own, or joins the process ``group`` given (a
        `fiberexec.multiprocessing.Process` joins its parent's, so the terminal's Ctrl-C
        reaches it as it reaches a stdlib child); either way in this process's session
        (see `_detach`). ``on_exit`` hears its exit (else the launcher's listener does).

        A child whose environment differs from the launcher's by more than fiberexec's own
        variables (an executor's ``env=``, the program's environment changed since) is
        forked by a second launcher that learns nothing, once this one has imported what
        workers did: what a module reads from the environment as it is imported is then
        the child's own."""
        changed, removed = environment_delta(self._env, env)
        plain = all(name.startswith(OWN_PREFIXES) for name in (*changed, *removed))
        fds = [] if log is not None else [1, 2] if output is None else [output, output]
        state = _procstate.capture()  # this process's, now: as a stdlib child has them
        tracker = _procstate.tracker_fd()
        if tracker is not None:
            fds.append(tracker)
        slot: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        with self._lock:
            if not plain and self._taught:
                twin = self._twin
                if twin is None or twin.gone:
                    twin = self._twin = Launcher(self._python, self._env, self._on_exit,
                                                 self._flags, learns=False)
            else:
                twin = None
                imports = _imports.learned_since(self._taught) if self.learns and plain else []
                # In a burst (others under way, or one asked for just before): more are
                # likely to follow, and the child may wait for them (`_Gate`).
                now = time.monotonic()
                burst = bool(self._waiting) or now - self._last_ask < GATE_QUIET_MS / 1000
                self._last_ask = now
                request = spawn_request(changed, removed, cwd, memory, log, program, group,
                                        burst=burst, imports=imports, state=state,
                                        tracker=tracker is not None)
                self._send(request, fds, slot, on_exit)
        if twin is not None:
            return twin.spawn(env=env, cwd=cwd, memory=memory, log=log, program=program,
                              output=output, group=group, on_exit=on_exit)
        try:
            reply = slot.get(timeout=SPAWN_TIMEOUT)
        except queue.Empty:
            raise LauncherError(
                f"the worker launcher did not answer within {SPAWN_TIMEOUT:g}s") from None
        if reply[0] != "spawned":
            raise LauncherError(f"the worker launcher could not fork: {reply[1]}")
        return reply[1]  # type: ignore[no-any-return]

    def _send(self, request: bytes, fds: list[int], slot: queue.SimpleQueue[tuple[Any, ...]],
              on_exit: Listener | None) -> None:
        """(Holding the lock.) Send a request; its reply comes to ``slot``."""
        try:
            socket.send_fds(self._sock, [request], fds)
        except OSError as exc:
            if exc.errno == errno.EMSGSIZE:  # the launcher lives: this request is too big
                raise LauncherError(
                    f"a request to fork is {len(request)} bytes, more than the "
                    "launcher's socket takes: the environment changed by that much "
                    "since the launcher started") from None
            self.gone = True
            raise LauncherError(f"the worker launcher is gone: {exc}") from None
        self._waiting.append((slot, on_exit or self._on_exit))

    def _next_waiting(self) -> tuple[queue.SimpleQueue[tuple[Any, ...]] | None, Listener | None]:
        with self._lock:
            return self._waiting.popleft() if self._waiting else (None, None)

    def _read(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_MESSAGE, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                self.gone = True
                with self._lock:
                    waiting, self._waiting = list(self._waiting), deque()
                for slot, _listener in waiting:
                    slot.put(("gone", "the launcher exited"))
                self._all_exited()
                return
            self._on_message(pickle.loads(data), fds)

    def _on_message(self, message: tuple[Any, ...], fds: list[int]) -> None:
        match message:
            case ("spawned", pid):
                with self._lock:  # never seen idle between the request and its child
                    slot, listener = self._waiting.popleft() if self._waiting else (None, None)
                    child = self._children[pid] = ForkedProcess(pid, fds[0], listener)
                self.forked += 1
                if slot is not None:
                    slot.put(("spawned", child))
            case ("failed", why):
                slot, _listener = self._next_waiting()
                if slot is not None:
                    slot.put(("failed", why))
            case ("exited", pid, code):
                gone = self._children.pop(pid, None)
                if gone is not None:
                    gone.exited(code)

    def _all_exited(self) -> None:
        """The launcher is gone (killed?): its children are reported by their pidfds."""
        for pid, child in list(self._children.items()):
            threading.Thread(target=self._await_pidfd, args=(pid, child), daemon=True).start()

    def _await_pidfd(self, pid: int, child: ForkedProcess) -> None:
        with contextlib.suppress(OSError):
            readable_within(child._pidfd, None)  # readable once the process is gone
        self._children.pop(pid, child)
        child.exited(-signal.SIGKILL)  # its status went to the launcher, which is gone

    def idle(self) -> bool:
        """No child of its own alive and no fork asked of it under way (nor of its twin)."""
        with self._lock:
            twin = self._twin
            if self._children or self._waiting:
                return False
        return twin is None or twin.idle()

    def drop_socket(self) -> None:
        """In a child forked from the process that started it: the copies of its socket,
        and its twin's, go (the parent's hang-up still ends them)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._twin is not None:
            self._twin.drop_socket()

    def pids(self) -> list[int]:
        """Its process id, and its twin's (see `spawn`), while they run."""
        twin = self._twin
        return ([] if self.gone else [self.proc.pid]) + ([] if twin is None else twin.pids())

    def close(self, timeout: float = 5.0) -> None:
        if self._twin is not None:
            self._twin.close(timeout)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout)


# ---------------------------------------------------------------------------- one per program


class SharedLaunchers:
    """This process's launchers, one per interpreter, options, preloaded modules and thread
    variables of numerical libraries (`fiberexec._threads`), shared by
    every backend that forks from one: started by the first that needs it and kept until the
    program ends, as the standard library's forkserver is, so an executor made after another
    (a pool per generation, a test suite) forks its workers at once instead of starting
    interpreters. An idle launcher is a process with no children and only the worker program
    loaded; one whose process ended (killed) is replaced at the next ask."""

    def __init__(self) -> None:
        self._launchers: dict[tuple[object, ...], Launcher] = {}
        self._lock = threading.Lock()
        self._closing = False  # the program is ending: start none
        self._at_exit = False  # `close` registered to run at the program's end
        os.register_at_fork(after_in_child=self._forget)

    def get(self, python: str, env: Mapping[str, str], flags: Sequence[str] = ()) -> Launcher:
        """The launcher for ``python`` with ``flags``, the preload ``env`` names and its
        numerical libraries' thread variables (`fiberexec._threads`: what it imports for its
        children is set up with them), started with ``env`` if none runs. `LauncherError`
        once the program is ending."""
        key = _key(python, flags, env.get(ENV_PRELOAD, ""), _threads.present(env))
        with self._lock:
            if self._closing:
                raise LauncherError("the program is ending: no launcher starts")
            launcher = stale = self._launchers.get(key)
            if launcher is None or launcher.gone:
                if not self._at_exit:
                    self._at_exit = True
                    atexit.register(self.close)
                launcher = self._launchers[key] = Launcher(python, env, flags=flags)
        if stale is not None and stale is not launcher:
            stale.close()  # it exited (killed): its status read, its reader ended
        return launcher

    def running(self, python: str, preload: str, flags: Sequence[str] = (),
                threads: Mapping[str, str] | None = None) -> bool:
        """Whether a launcher for these runs (a worker forked from it starts at once)."""
        with self._lock:
            launcher = self._launchers.get(_key(python, flags, preload, threads or {}))
            return launcher is not None and not launcher.gone

    def pids(self) -> list[int]:
        """The process ids of the launchers that run."""
        with self._lock:
            return [pid for launcher in self._launchers.values() for pid in launcher.pids()]

    def retire(self, launcher: Launcher) -> None:
        """``launcher`` died: the next `get` starts another."""
        with self._lock:
            for key, known in list(self._launchers.items()):
                if known is launcher:
                    del self._launchers[key]
        launcher.close()

    def close_idle(self) -> list[int]:
        """Close every launcher with no child and no fork under way; their pids."""
        with self._lock:
            idle = {key: launcher for key, launcher in self._launchers.items()
                    if launcher.idle()}
            for key in idle:
                del self._launchers[key]
        for launcher in idle.values():
            launcher.close()
        return [launcher.proc.pid for launcher in idle.values()]

    def close(self) -> None:
        """At the program's end: every launcher goes (their workers leave as their
        executors' connections close)."""
        with self._lock:
            self._closing = True
            launchers, self._launchers = list(self._launchers.values()), {}
        for launcher in launchers:
            launcher.close()

    def _forget(self) -> None:
        """In a child forked from this process: its launchers are the parent's. The child
        drops its copies of their sockets (so the parent's hang-up still ends them) and
        starts its own when it needs one."""
        launchers, self._launchers = list(self._launchers.values()), {}
        self._lock = threading.Lock()
        for launcher in launchers:
            launcher.drop_socket()


def _key(python: str, flags: Sequence[str], preload: str,
         threads: Mapping[str, str]) -> tuple[object, ...]:
    return python, tuple(flags), preload.strip(" ,"), _threads.key(threads)


shared_launchers = SharedLaunchers()


# ---------------------------------------------------------------------------- the launcher


def spawn_request(changed: Mapping[str, str], removed: Sequence[str], cwd: str,  # noqa: PLR0917
                  memory: int | None, log: str | None, program: str, group: int | None, *,
                  burst: bool, imports: Sequence[_imports.Module] = (),
                  state: _procstate.State | None = None, tracker: bool = False) -> bytes:
    """A request to fork, as `serve` reads it (see `Launcher.spawn` for the fields;
    ``imports``: modules to import first, `fiberexec._imports`; ``state``: the requester's,
    for the child; ``tracker``: the last descriptor sent along is the requester's resource
    tracker's pipe)."""
    return pickle.dumps(("spawn", dict(changed), list(removed), cwd, memory, log, program,
                         group, burst, list(imports), state, tracker))


def serve(fd: int) -> None:
    """The launcher process: fork a worker per request until the executor hangs up."""
    sock = socket.socket(fileno=fd)
    started_with = dict(os.environ)  # the environment its requests are told apart from
    _preload()
    _note_drift(started_with)
    _ROOMS.update(_rooms())
    gc.freeze()  # what is loaded now stays put: a child's collections do not copy its pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the poll through the pipe
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    gate = _Gate()
    while True:
        events = poller.poll(gate.wait_ms())
        if not events or gate.expired():
            gate.open()  # nothing more to fork right now (or held long enough): let them run
        for ready, _ in events:
            if ready == wake_r:
                os.read(wake_r, 4096)
                _reap(sock)
            elif not _serve_one(sock, (wake_r, wake_w), gate):
                os._exit(0)


class _Gate:
    """Children forked back to back, past a burst's first `GATE_BATCH`, wait, blocked,
    until the launcher has no more requests to serve (or `GATE_HOLD` has passed), then all
    start together.

    A child's start costs several times the fork that made it (its first memory writes are
    copies of the launcher's pages, its connection, its handshake); started at once, a few
    hundred of them would share the CPU with the launcher, which would fork the rest at a
    few hundredths of its own pace. Measured with 512 workers on 2 cores, the launcher then
    took 3.7 s to fork them all instead of under one. The gate is a pipe whose write end
    only the launcher keeps: a child reads until end of file, which comes when the launcher
    closes it (or exits). A burst's first few children (a small pool's all, the first of a
    large one's) and a single request (one `Process`, a replacement) are not held: they
    start as soon as they are forked, so a small pool's first worker does not wait for the
    fork of its second. A burst longer than `GATE_HOLD` starts in waves of that length
    (1024 workers take about 2 s to fork here), so the first workers of a very large pool
    do not wait for the last.
    """

    def __init__(self) -> None:
        self._fds: tuple[int, int] | None = None
        self._since = 0.0
        self._run = 0  # children forked in this burst so far (since the gate last opened)

    def hold(self, burst: bool) -> tuple[tuple[int, int] | None, bool]:
        """For the next child: the gate's pipe as it will be when it is forked (None: no
        child waits), and whether that child waits on it (a new pipe after each `open`).
        ``burst``: the executor asked for it amid others, so more are likely to come. A
        child that does not wait still gets the pipe: it inherits the write end with the
        launcher's other descriptors and must close it, or the children waiting would
        never see the end of the file."""
        self._run = self._run + 1 if burst else 0
        if self._run > GATE_BATCH and self._fds is None:
            self._fds = os.pipe2(os.O_CLOEXEC)
            self._since = time.monotonic()
        return self._fds, self._run > GATE_BATCH

    def wait_ms(self) -> int | None:
        """How long the launcher's poll may block: for ever with no child waiting; while
        some wait, as long as the executor takes between requests (`GATE_QUIET_MS`)."""
        return None if self._fds is None else GATE_QUIET_MS

    def expired(self) -> bool:
        return self._fds is not None and time.monotonic() - self._since >= GATE_HOLD

    def open(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None
            self._run = 0


def _await_gate(fds: tuple[int, int] | None, held: bool) -> None:
    """In a child: drop the gate's write end, then, if ``held``, block until the launcher
    opens it."""
    if fds is None:
        return
    read_end, write_end = fds
    os.close(write_end)
    while held and os.read(read_end, 1):  # (nothing is ever written: it ends at end of file)
        pass
    os.close(read_end)


def _preload() -> None:
    import importlib

    import fiberexec._codenames  # cloudpickle: what a script's function needs
    import fiberexec.worker  # noqa: F401  # what every worker runs: imported once, here
    from fiberexec import _auth

    # Each child proves its secret at once: OpenSSL sets up its HMAC on first use, which
    # done here is shared (about 0.1 ms and 40 copied pages less in each child).
    _auth.proof(_auth.new_nonce(), "worker", b"", b"")
    _imports.installed(__file__)  # where installed modules live, found once for every child

    for name in filter(None, os.environ.get(ENV_PRELOAD, "").split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception as exc:  # a worker imports it again, and reports the error there
            print(f"fiberexec launcher: cannot preload {name!r}: {exc!r}", file=sys.stderr)


def _serve_one(sock: socket.socket, pipe: tuple[int, int], gate: _Gate) -> bool:
    try:
        data, output, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 3)
    except OSError:  # reset: the executor went with a request unread, as a hang-up
        return False
    if not data:
        return False
    (_tag, changed, removed, cwd, memory, log, program, group, burst, imports, state,
     tracker) = pickle.loads(data)
    tracker_fd = output.pop() if tracker and output else None  # (sent last)
    kept = [] if tracker_fd is None else [tracker_fd]
    _load(program)
    if imports:
        before = dict(os.environ)
        if _imports.import_learned(imports):
            _note_drift(before)
            gc.freeze()  # (as after the preload: children do not copy these pages)
    gate_fds, held = gate.hold(burst)
    try:
        pid = os.fork()
    except OSError as exc:
        _close(output + kept)
        return _answer(sock, ("failed", repr(exc)))
    if pid == 0:
        _become_worker(sock, pipe, (gate_fds, held), (changed, removed), cwd, memory, log,
                       program, output, group, (state, tracker_fd))
    _close(output + kept)  # the child has them
    pidfd = os.pidfd_open(pid)
    try:
        if _answer(sock, ("spawned", pid), pidfd):
            return True
        # The executor hung up while we forked: it never learns of this child, which
        # would find the executor gone and say so. Nobody wants it: it goes now.
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return False
    finally:
        os.close(pidfd)


def _answer(sock: socket.socket, reply: tuple[Any, ...], pidfd: int | None = None) -> bool:
    """Send ``reply`` (and the child's pidfd); False once the executor has hung up."""
    try:
        socket.send_fds(sock, [pickle.dumps(reply)], [] if pidfd is None else [pidfd])
    except OSError:
        return False
    return True


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _load(program: str) -> None:
    """Import a program before the first fork of it: its children start with it loaded."""
    if program in sys.modules:
        return
    import importlib

    before = dict(os.environ)
    try:
        importlib.import_module(program)
    except Exception as exc:  # the child imports it again, and reports the error there
        print(f"fiberexec launcher: cannot preload {program!r}: {exc!r}", file=sys.stderr)
    _note_drift(before)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _become_worker(sock: socket.socket, pipe: tuple[int, int],  # noqa: PLR0917
                   gate: tuple[tuple[int, int] | None, bool],
                   env: tuple[dict[str, str], list[str]],
                   cwd: str, memory: int | None, log: str | None, program: str,
                   output: list[int], group: int | None,
                   inherited: tuple[_procstate.State | None, int | None]) -> None:
    """In the forked child: shed the launcher's parts, take the worker's settings, run it."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if group is not None:  # a Process, in the terminal's group: as a stdlib child
            signal.signal(signal.SIGTTOU, signal.SIG_DFL)
            signal.signal(signal.SIGTTIN, signal.SIG_DFL)
        sock.close()
        for fd in pipe:
            os.close(fd)
        _await_gate(*gate)
        _detach(group)
        if log is not None:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            output = [out, out]
        for target, fd in zip((1, 2), output, strict=False):
            os.dup2(fd, target)
        _close(sorted(set(output)))
        os.chdir(cwd)
        _adopt_environment(*env)
        state, tracker_fd = inherited
        if state is not None:  # a worker keeps the signals it handles (`WORKER_SIGNALS`)
            _procstate.apply(state, keep=WORKER_SIGNALS if program == WORKER_PROGRAM else ())
        if tracker_fd is not None:
            _procstate.adopt_tracker(tracker_fd)
        _imports.fresh_random_state()
        _shown_as(env[0])
        if memory is not None:
            _limit_address_space(memory)
        _run(program)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _rooms() -> dict[str, int]:
    """Where, in this process's memory, the launcher's environment keeps the room for each
    `SHOWN` variable: the environment it started with, where /proc/<pid>/environ reads. A
    forked child has it at the same address (`_shown_as`). Empty if not there as expected."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5): 50, 51)
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except (OSError, ValueError, IndexError):
        return {}
    if len(block) != end - start:
        return {}
    room = b" " * SHOWN_WIDTH
    rooms = {}
    for name in SHOWN:
        key = b"\0" + name.encode() + b"="
        at = block.find(key)
        if at >= 0 and block[at + len(key):at + len(key) + SHOWN_WIDTH + 1] == room + b"\0":
            rooms[name] = start + at + len(key)
    return rooms


_ROOMS: dict[str, int] = {}  # the launcher's `_rooms`, found once before it forks


def _shown_as(env: Mapping[str, str]) -> None:
    """Write this child's `SHOWN` variables over the room the launcher's environment keeps
    for them (as ``setproctitle`` rewrites a command line): a forked worker is then named
    by its executor and worker id in /proc/<pid>/environ, as a fresh one is."""
    if not _ROOMS:
        return
    import ctypes

    for name, address in _ROOMS.items():
        value = env.get(name, "").encode()[:SHOWN_WIDTH].ljust(SHOWN_WIDTH)
        ctypes.memmove(address, value, SHOWN_WIDTH)


def _detach(group: int | None) -> None:
    """A process group of its own (a worker: the terminal's Ctrl-C is not for it), or the
    ``group`` asked for; a group that is gone or elsewhere gives one of its own. Never a
    session of its own: where the kernel groups processes by session for scheduling
    (autogroup, on by default in many distributions), each new session is weighed as much
    as the executor's process with all its threads, so busy workers would leave those
    threads together one worker's share. In the caller's session they are scheduled as the
    standard library's workers are."""
    if group is not None:
        try:
            os.setpgid(0, group)
            return
        except OSError:
            pass
    os.setpgid(0, 0)


def environment_delta(base: Mapping[str, str],
                      env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """What makes ``base`` (the launcher's environment) into ``env``: the names set to
    another value, and the names removed. Computed by the executor, so a forked child
    touches only the few names a worker's own variables change (reading the whole
    environment in each child cost it about 75 copied pages and 0.3 ms)."""
    changed = {name: value for name, value in env.items() if base.get(name) != value}
    return changed, [name for name in base if name not in env]


_DRIFT: dict[str, str | None] = {}  # what the launcher's imports changed (None: set anew)


def _note_drift(before: dict[str, str]) -> None:
    """Note what imports in the launcher (preloaded modules, programs) changed in its
    environment since ``before``: a child puts it back, since its request is told apart
    from the environment the launcher started with, and a child has the environment its
    requester asked for, whatever the launcher's imports did to the launcher's own."""
    now = os.environ
    for name in {*before, *now}:
        if before.get(name) != now.get(name):
            _DRIFT.setdefault(name, before.get(name))


def _adopt_environment(changed: dict[str, str], removed: list[str]) -> None:
    """Make the launcher's environment the child's (`environment_delta`): first as the
    launcher started (`_DRIFT`), then as asked."""
    for name, value in _DRIFT.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for name in removed:
        os.environ.pop(name, None)
    for name, value in changed.items():
        os.environ[name] = value


def _run(program: str) -> None:
    if program == WORKER_PROGRAM:
        from fiberexec import worker

        worker.run()
        return
    import importlib

    module = importlib.import_module(program)  # loaded by the launcher already
    sys.argv = [module.__file__ or program]
    sys.modules["__main__"] = module  # as under ``python -m``: pickles of __main__ ask it
    module.main()


def _limit_address_space(memory: int) -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory if hard == resource.RLIM_INFINITY else min(memory, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
