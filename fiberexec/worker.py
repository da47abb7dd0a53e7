"""The worker program every backend launches: ``python -m fiberexec.worker``.

It connects to the executor (its local socket ``FIBEREXEC_LOCAL_ADDRESS`` where it can reach
it, else the network address ``FIBEREXEC_ADDRESS``: see `fiberexec._link`), authenticates
with ``FIBEREXEC_SECRET``, runs tasks in the order they arrive, and sends each result back as
its task ends (results of tiny tasks share a message, held at most `FLUSH_AGE`). It exits when
the executor says goodbye, when the connection drops, or when the executor falls silent for
the session's ``silence`` timeout (tens of seconds: a busy executor is slow, not gone), so a
worker never outlives its executor.

The main thread receives and runs tasks; tasks sent ahead (prefetch) wait in the link's
receive buffer, so no thread hop sits between a task's arrival and its start. The `Outbox` timer
thread sends held results and heartbeats (with the process's CPU and memory use) while a task
runs, takes in what the executor sent meanwhile, and answers a request for the threads' stacks
(so a stuck task can be seen). The connection's removal ends the process at once.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import math
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from resource import RUSAGE_THREAD, getrusage, struct_rusage
from typing import Any, NoReturn, TypeVar

from fiberexec import (
    _auth,
    _capture,
    _claims,
    _contract,
    _functions,
    _import_hooks,
    _mainspace,
    _procstate,
    _shm,
    _syspath,
    _threads,
)
from fiberexec import _protocol as p
from fiberexec._argcache import Store
from fiberexec._claims import ClaimBoard
from fiberexec._errors import ConfigurationError, LinkClosed, ProtocolError
from fiberexec._imports import ImportWatch
from fiberexec._introspect import Usage, format_stacks
from fiberexec._link import WorkerLink, connect, dial
from fiberexec._serialize import Payload, dumps, dumps_exception, dumps_scalar, loads
from fiberexec._timer import OneShot

EXIT_AUTH_FAILED = 3
EXIT_NO_EXECUTOR = 4
EXIT_INIT_FAILED = 5
EXIT_NO_BOARD = 6
FLUSH_COUNT = 512
FLUSH_BYTES = 8 << 20
FLUSH_AGE = 0.0002  # seconds a finished result may wait for others to share its message
SLOW_TASK = 0.0002  # a task this slow sends its result at once: batching would only delay it
SEND_TIMEOUT = 30.0  # seconds a send may block on an executor that stopped reading
LEAVE_TIMEOUT = 10.0  # seconds a leaving worker waits for the executor to hang up
SETTLE_TIMEOUT = 5.0  # seconds a failing worker's exit handlers may take to flush its output
THREADS_WAIT = 5.0  # seconds an ending worker waits for threads its tasks left running
FAREWELL_WAIT = 0.5  # seconds a worker leaving a silent executor waits to say why
OUTPUT_AGE = 0.05  # seconds a task's output line may wait for others to share its message
WATCH_AFTER = 0.005  # seconds a stretch of tasks runs before a second thread reads the link
WATCH_ALONE = 0.5  # the same for a task nothing is sent to wait behind (`Tasks.alone`): only
# a stack request can come, and it is answered within this
M = TypeVar("M")


class _Config:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.address = environ[_contract.ENV_ADDRESS]
        self.local_address = environ.get(_contract.ENV_LOCAL_ADDRESS, "")
        self.worker_id = environ.get(_contract.ENV_WORKER_ID, f"w{os.getpid()}")
        self.executor_id = environ.get(_contract.ENV_EXECUTOR_ID, "")
        self.secret = _auth.secret_from_hex(environ[_contract.ENV_SECRET])
        self.nonce = _auth.nonce_from_hex(environ[_contract.ENV_NONCE])  # the executor's
        self.connect_timeout = float(environ.get(_contract.ENV_CONNECT_TIMEOUT, "60"))
        self.tls_cert = environ.get(_contract.ENV_TLS_CERT)
        self.tls_server_name = environ.get(_contract.ENV_TLS_SERVER_NAME, "")


class Worker:
    """One worker's state: the tasks it was sent ahead (prefetch) and the results it owes."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.tls = None
        if config.tls_cert:
            from fiberexec._tls import client_config  # (pynng's TLS: workers on other hosts)

            self.tls = client_config(config.tls_cert, config.tls_server_name)
        self.link: WorkerLink = connect(
            config.local_address, config.address, max_frame=p.MAX_MESSAGE,
            on_remove=self._on_disconnect, tls=self.tls, timeout=config.connect_timeout,
        )
        self.shm = p.ShmPolicy()
        self.allow_shm = False
        self.store: Store | None = None  # large arguments kept (fiberexec._argcache)
        self.heartbeat = 1.0
        self.silence = 30.0  # seconds of the executor's silence after which this worker leaves
        self.max_tasks = 0
        # each with `Tasks.alone`, and its number among the tasks received (`_claims`)
        self.tasks: deque[tuple[p.Task, _Functions, bool, int]] = deque()
        self.received = 0
        self.claims: ClaimBoard | None = None  # with the executor on this host
        self.stopping = False
        self.doing: str | None = None  # what the main thread runs (None: it waits)
        self.interruptible = False  # a task's own code runs: SIGINT interrupts it
        self._leaving: tuple[int, str] | None = None  # exit code and words, once leaving
        self.last_heard = time.monotonic()
        self._recv_lock = threading.Lock()  # one receiver at a time: main or outbox thread
        self._tasks_lock = threading.Lock()  # the main thread takes, a revoke gives back
        self._last_check = 0.0
        self._threads_seen = 0  # threading.active_count() when last looked at (`_mind_threads`)
        self.imports = ImportWatch()  # what the tasks (and the initializer) import from here on
        self.outbox = Outbox(self._send_frame, watch=self.check_executor,
                             working=self.working)
        self.watcher: Watcher | None = None  # with the outbox's thread, `start_threads`

    def start_threads(self) -> None:
        """Start the watcher's and the outbox's threads (once). The handshake does it while
        the executor answers its hello: a thread's start in a freshly forked process takes
        a few tenths of a millisecond, which the wait hides. The outbox's thread sends
        nothing until the handshake has ended (`Outbox.open`)."""
        if self.watcher is not None:
            return
        # (the link's own, as it is then: a local connection refused falls back to the network)
        self.watcher = Watcher(lambda: self.link.fileno(), self.take_in)  # noqa: PLW0108
        threading.Thread(target=_guard(self.outbox.run_timer), name="fiberexec-outbox",
                         daemon=True).start()

    # ---------------------------------------------------------------- handshake

    def handshake(self) -> p.Setup:
        """Authenticate; a local connection the executor refuses falls back to the network."""
        try:
            return self._handshake()
        except LinkClosed:
            if self.link.kind != "unix" or not self.config.address:
                _die(EXIT_NO_EXECUTOR, "the executor hung up during the handshake (it is "
                     "shutting down, or has exited)")
        self.link.close()
        try:
            self.link = dial(self.config.address, max_frame=p.MAX_MESSAGE,
                             on_remove=self._on_disconnect, tls=self.tls,
                             timeout=self.config.connect_timeout)
        except LinkClosed as exc:
            _die(EXIT_NO_EXECUTOR, str(exc))
        try:
            return self._handshake()
        except LinkClosed:
            _die(EXIT_NO_EXECUTOR, f"the executor at {self.config.address} hung up")

    def _handshake(self) -> p.Setup:
        global _probe
        cfg = self.config
        nonce = _auth.new_nonce()
        proof = _auth.proof(cfg.secret, "worker", nonce, cfg.nonce)
        # On the local link (the executor's host and network namespace, its user: and there,
        # nearly always its /dev/shm), a probe there shows the executor whether it is the
        # same (see `fiberexec._protocol`), with the claim board beside it. (A worker on the
        # network link makes none: one whose executor is gone would leave them behind.)
        probe, board = "", None
        if self.link.kind == "unix" and cfg.executor_id and _shm.available():
            probe = _probe = _shm.write_probe(cfg.executor_id, proof)
            board = ClaimBoard.create(probe) if probe else None
        try:
            hello = p.Hello(cfg.worker_id, nonce, os.getpid(), socket.gethostname(), proof,
                            probe)
            self.link.send(p.encode(hello), cfg.connect_timeout)
            self.start_threads()
            setup = self._expect(p.Setup, cfg.connect_timeout)
            if not _auth.verify(_auth.proof(cfg.secret, "executor", nonce, cfg.nonce),
                                setup.proof):
                _die(EXIT_AUTH_FAILED, "the executor failed authentication (wrong secret?)")
            if board is not None and setup.claims and setup.shm and not board.open_lock():
                self._no_board(board.name)
        except BaseException:
            if board is not None:
                board.close()
            raise
        finally:
            _forget_probe()  # (the executor unlinked its names too, if it saw them)
        self.allow_shm = setup.shm
        if board is not None and setup.claims and setup.shm:
            self.claims = board
        elif board is not None:
            board.close()
        if self.allow_shm:
            self.shm = p.ShmPolicy(executor_id=cfg.executor_id or None)
            self.outbox.shm = self.shm
        self.heartbeat, self.max_tasks = setup.heartbeat, setup.max_tasks
        self.silence = setup.silence
        self.store = Store(setup.arg_cache) if setup.arg_cache else None
        return setup

    def redirect_output(self, mode: p.OutputMode) -> None:
        """Send the tasks' stdout and stderr to the executor, or nowhere, as it asks."""
        global _captured
        _captured = mode is not p.OutputMode.INHERIT
        if mode in (p.OutputMode.FORWARD, p.OutputMode.FILES):
            outbox = self.outbox
            prefix = b""
            if mode is p.OutputMode.FORWARD:
                prefix = f"[{self.config.worker_id} {socket.gethostname()}] ".encode()
            outbox.capture = _capture.Capture(send=outbox.send_output, wake=outbox.wake,
                                              prefix=prefix)
            _capture.install(outbox.capture)
        elif mode is p.OutputMode.DISCARD:
            _capture.install(None)

    def _no_board(self, name: str) -> NoReturn:
        """The Setup says the executor made this worker's claim board, and its semaphore is
        not there: the executor let this worker go since (it unlinks the names then), and
        hangs up, which ends this worker as any hang-up does. One still there after the
        handshake's timeout made a board that cannot be opened here: without it the
        executor would take back tasks this worker then runs anyway, so it exits."""
        deadline = time.monotonic() + self.config.connect_timeout
        with self._recv_lock:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    self.link.recv(left)  # (a task sent meanwhile goes back on our exit)
                except LinkClosed:
                    self._executor_gone("the executor hung up during the handshake")
        _die(EXIT_NO_BOARD, f"the executor made this worker's claim board ({name}) and its "
             "semaphore cannot be opened here")

    def _expect(self, kind: type[M], timeout: float) -> M:
        frame = self.link.recv(timeout)
        if frame is None:
            _die(EXIT_NO_EXECUTOR, f"no answer from the executor at {self.config.address}")
        message = p.decode(frame, allow_shm=False)
        if not isinstance(message, kind):
            raise ProtocolError(f"expected {kind.__name__}, got {type(message).__name__}")
        return message

    def run_initializer(self, setup: p.Setup) -> None:
        if setup.initializer is None:
            return
        try:
            fn, args = loads(setup.initializer, what="initializer")
            if _functions.MAIN_MARK in setup.initializer.data:
                fn = _mainspace.home(fn)
                _mainspace.adopt((fn, args))
            self.doing = "running the initializer"
            fn(*args)
            self.doing = None
            self._mind_threads()
        except BaseException as exc:
            # What the standard library's workers log, so handlers users attach still see it.
            logging.getLogger("concurrent.futures").critical(
                "Exception in initializer:", exc_info=True
            )
            _settle_output()  # the executor breaks on InitFailed: what was logged goes first
            self.outbox.push_output()
            self.outbox.send(p.InitFailed(dumps_exception(exc)))
            self.leave(EXIT_INIT_FAILED, f"initializer failed: {exc!r}")
        self.outbox.push_output()
        self.outbox.send(p.Initialized())

    def _mind_threads(self) -> None:
        """(Main thread.) While threads tasks started run (not daemons), the executor's stop
        at shutdown (SIGTERM, just after it hung up) lets them finish first, as at any
        orderly end (`_die`); SIGTERM's default action is back once none is left. A
        handler a task installed is left alone."""
        self._threads_seen = threading.active_count()
        wanted = _when_stopped if _task_threads() else signal.SIG_DFL
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _when_stopped):
            signal.signal(signal.SIGTERM, wanted)

    # ---------------------------------------------------------------- receiving

    def receive(self, *, block: bool) -> None:
        """Take in what the executor sent; with ``block``, wait until something arrives."""
        with self._recv_lock:
            # The outbox thread may have taken in tasks just before: then do not wait.
            block = block and not self.tasks and not self.stopping
            if block:  # idle, the results sent: what the tasks imported goes out now
                self._report_imports()
            self._receive(block)

    def _take_buffered(self) -> None:
        """Take in frames the link already holds, with no system call: a result whose task
        has no successor here goes out at once, before anything else is asked of the kernel."""
        with self._recv_lock:
            while (frame := self.link.buffered()) is not None:
                self.last_heard = time.monotonic()
                self._on_message(p.decode(frame, allow_shm=self.allow_shm, store=self.store))

    def working(self) -> bool:
        """Whether a task runs or waits here (read by the outbox thread: a worker with none
        sends its heartbeats at the idle pace, `_protocol.keepalive`)."""
        return self.doing is not None or bool(self.tasks)

    def take_in(self) -> None:
        """From the watcher thread, while the main thread runs a task: take in what
        arrived (a revoke is answered at once)."""
        if self._recv_lock.acquire(blocking=False):  # else the main thread is reading
            try:
                self._receive(block=False)
            finally:
                self._recv_lock.release()

    def check_executor(self) -> None:
        """From the outbox thread, while the main thread runs a task: take in what arrived,
        and leave if the executor has been silent for ``silence`` seconds."""
        now = time.monotonic()
        if now - self._last_check < self.heartbeat / 2:
            return
        self._last_check = now
        if self._recv_lock.acquire(blocking=False):  # else the main thread is receiving
            try:
                self._receive(block=False)
            finally:
                self._recv_lock.release()
            self._judge_silence(idle=False)

    def _receive(self, block: bool) -> None:
        """Take in every waiting frame (then judge silence: a stalled worker drains first)."""
        link = self.link
        try:
            frame = link.recv(self.silence / 4) if block else link.try_recv()
            while frame is not None:  # then what that read brought along: no system call
                self.last_heard = time.monotonic()
                self._on_message(p.decode(frame, allow_shm=self.allow_shm, store=self.store))
                frame = link.buffered()
        except LinkClosed as exc:
            self._executor_gone(str(exc))
        if block:  # (the main thread, with no task to run)
            self._judge_silence(idle=True)

    def _judge_silence(self, *, idle: bool) -> None:
        """Leave an executor silent for ``silence`` seconds. ``idle`` (no task running):
        say why first, so a stalled executor that wakes retires this worker and sends what
        it held elsewhere, uncharged. A worker leaving mid-task says nothing: its task is
        charged with the loss, as any interrupted run (``max_task_retries`` counts it)."""
        silent = time.monotonic() - self.last_heard
        if silent > self.silence:
            why = (f"it heard nothing from the executor for {silent:.0f}s "
                   f"(silence_timeout={self.silence:g})")
            if idle:  # read when the executor wakes (over a cut network, nowhere: brief)
                self.outbox.farewell(why, lambda frame: self.link.send(frame, FAREWELL_WAIT),
                                     FAREWELL_WAIT)
            self._executor_gone(why)

    def _on_message(self, message: p.Message) -> None:
        if isinstance(message, p.Tasks):
            functions = _Functions(message.functions)
            first = self.received
            self.received += len(message.tasks)
            self.tasks.extend((t, functions, message.alone, first + i)
                              for i, t in enumerate(message.tasks))
        elif isinstance(message, p.Revoke):
            self._give_back(set(message.task_ids))
        elif isinstance(message, p.Bye):
            self.stopping = True
        elif isinstance(message, p.DumpStack):
            stacks = format_stacks(threading.main_thread().ident, doing=self.doing)
            self.outbox.send(p.Stack(message.request_id, stacks))
        elif isinstance(message, p.Interrupt) and self.interruptible:
            # (From the watcher: the main thread runs the task.) As a terminal's Ctrl-C
            # reaches a standard library worker: whatever handler the task has runs.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def on_sigint(self, signum: int, frame: object) -> None:
        """SIGINT (`Interrupt`, or someone's ``kill -INT``): ``KeyboardInterrupt`` in the
        task running, which fails with it; none running, nothing happens, where Python's
        default would end this worker between tasks."""
        if self.interruptible:
            raise KeyboardInterrupt

    def _give_back(self, wanted: set[int]) -> None:
        """Hand back the wanted tasks this worker has not started (it runs the rest)."""
        with self._tasks_lock:
            kept = [entry for entry in self.tasks if entry[0].task_id not in wanted]
            given = [entry[0].task_id for entry in self.tasks if entry[0].task_id in wanted]
            self.tasks.clear()
            self.tasks.extend(kept)
        self.outbox.send(p.Revoked(given))

    def _on_disconnect(self, _pipe: object) -> None:
        self._executor_gone("the connection to the executor closed")

    def _executor_gone(self, why: str) -> None:
        if self.config.executor_id:
            _shm.remove_all(self.config.executor_id)
        if self._leaving is not None:  # the hang-up `leave` waits for
            _die(*self._leaving)
        _die(0, f"{why}; exiting")

    def leave(self, code: int, why: str) -> NoReturn:
        """Exit once the executor has hung up: it does on this worker's last word (`Bye`,
        `InitFailed`), so everything sent before has arrived (a link may drop frames still
        queued when the process ends). Bounded by `LEAVE_TIMEOUT`."""
        self._leaving = (code, why)
        deadline = time.monotonic() + LEAVE_TIMEOUT
        with self._recv_lock:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    self.link.recv(left)  # what still comes is for a worker that stays
                except LinkClosed:
                    break
        _die(code, why)

    # ---------------------------------------------------------------- main thread

    def serve(self) -> None:
        done = 0
        outbox = self.outbox
        watcher = self.watcher
        assert watcher is not None  # (the handshake started it)
        slow = False  # the last task ran long enough for more to be sent meanwhile
        watch_after = WATCH_AFTER  # when the watcher starts reading, as the next task runs
        alone = False  # and none were: it came as `Tasks.alone`
        while not self.stopping or self.tasks:
            if not self.tasks:
                # Tasks sent meanwhile keep the stretch going: past `WATCH_AFTER` the
                # watcher takes them in while a task runs, and results go out beside it.
                # (After a quick task, the system call would only delay a round trip.)
                if slow and not alone:
                    self.receive(block=False)
                if not self.tasks:
                    watcher.unwatch(idle=True)  # this thread waits on the link itself now
                    outbox.flush()
                    self.receive(block=True)
                continue
            task = self._next_task()
            if task is None:
                continue
            # While it runs, the executor may send more to wait behind it, and ask for
            # some back: the watcher reads for this thread. (If the executor sends nothing
            # to wait behind it, only a stack request can come: the watcher starts late.)
            alone = task[2]
            watcher.watch(WATCH_ALONE if alone else watch_after)
            # After a slow task, this one's use of the CPU is taken too (two system calls,
            # which a quick task does without: the first slow one after quick ones counts as
            # waiting). Not for one sent alone: its result goes out from here in any case.
            timed = slow and not alone
            before = getrusage(RUSAGE_THREAD) if timed else None
            self.doing = "running the task"
            result = self._run(task[0], task[1])
            self.doing = None
            if threading.active_count() != self._threads_seen:  # a task started or ended one
                self._mind_threads()
            del task  # its arguments' shared memory is free for the executor to fill again
            done += 1
            if self.max_tasks and done >= self.max_tasks:
                watcher.unwatch()
                outbox.add(result, alone=True, slow=True)
                outbox.finish()
                outbox.send(p.Bye("max_tasks_per_child reached"))
                return
            if not self.tasks:
                self._take_buffered()
            slow = result.runtime >= SLOW_TASK
            # A slow task that kept this thread on the CPU (it held the GIL): the next one
            # likely does too, and the outbox thread could send this result only by taking
            # the GIL from it (a forced switch, a wait of up to the switch interval): send
            # it here. One that waited (sleep, I/O, released the GIL) leaves the sending to
            # the outbox thread, beside the next task.
            busy = slow and before is not None and _kept_on_cpu(before, result.runtime)
            outbox.add(result, alone=busy or not self.tasks, slow=slow)
            watch_after = WATCH_AFTER
            if busy:
                # Likewise the watcher: it would wake for each message only to wait for
                # the GIL. Between such tasks this thread takes in what arrived itself
                # (with none left, the loop's top does), and during the next the watcher
                # starts only once it outruns this one twice (when the executor would ask
                # for what waits behind it): on a machine with more busy processes than
                # cores, such tasks outlast `WATCH_AFTER`, and the watcher woke for each.
                watcher.unwatch()
                watch_after = min(max(WATCH_AFTER, 2 * result.runtime), WATCH_ALONE)
                if self.tasks:
                    self.receive(block=False)
        watcher.unwatch()  # leave() reads the link itself
        outbox.finish()
        outbox.send(p.Bye("asked to leave"))

    def _report_imports(self) -> None:
        """On the executor's host, tell it the installed modules the tasks imported, for
        its launcher (`fiberexec._imports`)."""
        if len(sys.modules) != self.imports.count and self.link.kind == "unix":
            found = self.imports.new()
            if found:
                self.outbox.send(p.Imported(found))

    def _next_task(self) -> tuple[p.Task, _Functions, bool, int] | None:
        """The next task to run, or None: none is left, or the executor took it back (it
        runs elsewhere)."""
        with self._tasks_lock:
            if not self.tasks:
                return None
            task = self.tasks.popleft()
        if self.claims is not None and not self._claim(task[3]):
            return None
        return task

    def _claim(self, number: int) -> bool:
        """Whether task ``number`` is still this worker's to run (see `fiberexec._claims`)."""
        assert self.claims is not None
        while (ours := self.claims.claim(number)) is None:
            self.receive(block=False)  # the executor hung up holding the board: we leave
        return ours

    def _run(self, task: p.Task, functions: _Functions) -> p.Result:
        start = time.perf_counter()
        try:
            fn = functions.get(task.function)
            args, kwargs = loads(task.args, what="arguments")
            if _functions.MAIN_MARK in task.args.data:  # an object of the caller's script, by value
                args, kwargs = _mainspace.settle(args, kwargs)
            self.interruptible = True
            value = fn(*args, **kwargs)
            self.interruptible = False
            payload = dumps_scalar(value)
            if payload is None:  # (a number or short text needs none of the checks below)
                payload = dumps(value, what="result",
                                main_by_reference=_mainspace.by_reference)
                p.check_fits(payload, self.shm.executor_id is not None,
                             "the result and its buffers")
            status = p.Status.OK
        except BaseException as exc:  # what the task raised (SystemExit too) goes to its future
            self.interruptible = False
            if isinstance(exc, MemoryError):
                _note_memory_limit(exc)
            payload, status = dumps_exception(exc), p.Status.RAISED
        return p.Result(task.task_id, status, payload, time.perf_counter() - start)

    def _send_frame(self, frame: bytes) -> None:
        try:
            self.link.send(frame, timeout=SEND_TIMEOUT)
        except LinkClosed as exc:
            self._executor_gone(str(exc))


class Outbox:
    """Finished results on their way to the executor, and the thread that keeps them moving.

    The main thread adds each result as its task ends; a result is sent at once, or held to
    share a message with the next ones for at most `FLUSH_AGE`. The timer thread sends what
    is held when the main thread is busy with a longer task, and sends heartbeats while it
    runs one, so a finished result never waits behind the next task. (After a task that
    kept its thread on the CPU at least half its time, the main thread sends its result
    itself: the timer thread could send it only by taking the GIL from the next such task.)

    Holding a result arms a kernel timer the timer thread sleeps on, and a flush disarms
    it: in a quick stretch of tasks, the main thread sends what is held itself when the
    stretch ends, and the timer thread is not woken at all (waking it for every result held
    cost each worker a thread switch and a fight for the GIL per message, a third of its
    CPU on a map of quick tasks). Output held and slow results wake it at once (``_kick``).
    """

    def __init__(
        self,
        send_frame: Callable[[bytes], None],
        shm: p.ShmPolicy | None = None,
        watch: Callable[[], None] = lambda: None,
        working: Callable[[], bool] = lambda: True,
    ) -> None:
        self._send_frame = send_frame
        self.shm = shm
        self._watch = watch  # called on every wake of the timer thread
        self._working = working  # whether a task runs or waits (else: the idle pace)
        # Reentrant: the timer thread, holding it, may take in a Revoke and answer it.
        self._lock = threading.RLock()
        self._results: list[p.Result] = []
        self._nbytes = 0
        self._since: float | None = None  # when the oldest held result was added
        self.last_sent = time.monotonic()
        self._usage = Usage()
        self._last_beat = time.monotonic()
        self.capture: _capture.Capture | None = None  # with output="forward"
        self._timer = OneShot()  # fires when what is held is due: the timer thread wakes
        self._timer_armed = False  # for results held (a flush disarms it)
        self._kick = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # wakes it now
        self._heartbeat = self._idle_beat = 1.0
        self._opened = threading.Event()  # the handshake is done: the timer thread may send

    def add(self, result: p.Result, *, alone: bool, slow: bool) -> None:
        """Hold ``result``, or send it.

        ``alone``: no task follows, so nothing can overlap with sending: send it here and
        now. ``slow``: batching would only delay it: the outbox thread sends it while the
        next task already runs. Otherwise it waits for a few more, at most `FLUSH_AGE`.
        """
        self.push_output()
        if self.capture is not None:
            self.capture.end_lines()
        now = time.monotonic()
        with self._lock:
            self._results.append(result)
            self._nbytes += result.payload.nbytes
            first = self._since is None
            if first:
                self._since = now
            if alone or self._due(now):
                self._flush_locked()
                return
            if slow:  # the timer thread sends it now, while the next task runs
                self._since = now - FLUSH_AGE
                os.eventfd_write(self._kick, 1)
            elif first:  # it sends them when due, unless this thread does first
                self._timer.arm(FLUSH_AGE)
                self._timer_armed = True

    def _due(self, now: float) -> bool:
        assert self._since is not None
        return (
            len(self._results) >= FLUSH_COUNT
            or self._nbytes >= FLUSH_BYTES
            or now - self._since >= FLUSH_AGE
        )

    def flush(self) -> None:
        self.push_output()
        with self._lock:
            if self._results:
                self._flush_locked()
            elif self.capture is not None and self.capture.size:
                self.beat()

    def send(self, message: p.Message) -> None:
        """Send a control message, after any results and output held (order is kept)."""
        with self._lock:
            if self._results:
                self._flush_locked()
            elif self.capture is not None and self.capture.size:
                self.beat()
            self._send_locked(p.encode(message, self.shm))

    def _flush_locked(self) -> None:
        # What the tasks printed is out before their results: the executor's caller may
        # read the output as soon as it has a result.
        if self.capture is not None and self.capture.size:
            self.beat()
        elif self.capture is None:  # (a captured stream is flushed by push_output)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
        results, self._results, self._nbytes, self._since = self._results, [], 0, None
        self._send_locked(p.encode(p.Results(results), self.shm))
        if self._timer_armed:  # nothing is held: the timer thread sleeps on
            self._timer_armed = False
            self._timer.disarm()

    def farewell(self, reason: str, send: Callable[[bytes], None], timeout: float) -> None:
        """Best effort, as the worker leaves an executor that fell silent: a `Bye` saying
        why, sent with ``send`` (which gives up soon), after waiting at most ``timeout`` for
        the lock (a thread may be blocked sending to the executor). Results went before it
        (they wait `FLUSH_AGE` at most, silence is seconds): an executor that was only
        stalled reads them, and this, when it wakes."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            with contextlib.suppress(Exception):
                send(p.encode(p.Bye(reason)))
        finally:
            self._lock.release()

    def send_output(self) -> None:
        """Send the output held now (from a task printing fast: it waits on the link)."""
        self.beat()

    def wake(self) -> None:
        """Output is held: the timer thread sends it within `OUTPUT_AGE`."""
        os.eventfd_write(self._kick, 1)

    def finish(self) -> None:
        """The worker leaves: send what is held, lines not ended yet too."""
        self.push_output()
        with self._lock:
            if self._results:
                self._flush_locked()
            if self.capture is not None:
                out, err = self.capture.take(everything=True)
                if out or err:
                    self._send_locked(p.encode(p.Heartbeat(stdout=out, stderr=err)))

    def _send_locked(self, frame: bytes) -> None:
        self._send_frame(frame)
        self.last_sent = time.monotonic()

    def beat(self) -> None:
        """Send a heartbeat with this process's CPU and memory use, and output held."""
        with self._lock:
            self._last_beat = time.monotonic()
            out, err = self.capture.take() if self.capture is not None else (b"", b"")
            self._send_locked(p.encode(p.Heartbeat(*self._usage.read(), out, err)))

    def open(self, heartbeat: float, silence: float) -> None:
        """The handshake is done: the timer thread starts its work, with a heartbeat every
        ``heartbeat`` seconds while the worker works, and at the idle pace (`_protocol.keepalive`)
        while it waits for tasks."""
        self._heartbeat = heartbeat
        self._idle_beat = p.keepalive(heartbeat, silence)
        self._opened.set()

    def run_timer(self) -> None:
        """The timer thread: flush held results when due; a heartbeat with the process's
        resource use every ``heartbeat`` seconds (also while results flow, so the executor
        sees a busy worker's use too)."""
        # No timeout: the handshake either ends (`open`) or its process exits (`_die`).
        self._opened.wait()
        busy, idle = self._heartbeat, self._idle_beat
        poller = select.poll()
        poller.register(self._timer.fileno(), select.POLLIN)
        poller.register(self._kick, select.POLLIN)
        while True:
            self.push_output()  # so a line printed in a long task is seen within OUTPUT_AGE
            with self._lock:
                delay = self._timer_step(busy if self._working() else idle)
                if delay is not None and delay < 0.001:  # finer than poll's milliseconds
                    self._timer.arm(delay)
                    self._timer_armed = True
            if delay is not None:
                poller.poll(math.ceil(delay * 1000))
                self._timer.drain()
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._kick)

    def _timer_step(self, heartbeat: float) -> float | None:
        """Send what is due (None), or say how long until something may be (a heartbeat
        ``heartbeat`` seconds after the last one)."""
        self._watch()
        now = time.monotonic()
        delay = self._last_beat + heartbeat - now
        if delay <= 0:
            self.beat()
            return None
        if self._since is not None:
            flush = self._since + FLUSH_AGE - now
            if flush <= 0:
                self._flush_locked()
                return None
            delay = min(delay, flush)
        if self.capture is not None:
            since = self.capture.since
            due = OUTPUT_AGE if since is None else since + OUTPUT_AGE - now
            if due <= 0:
                self.beat()
                return None
            delay = min(delay, due)
        return delay

    def push_output(self) -> None:
        """Push what tasks wrote through their streams' buffers into the capture. Never
        with the outbox's lock held: a printing thread holds its stream's lock and may
        want the outbox's (to send when much is held)."""
        if self.capture is not None:
            self.capture.flush_streams()


def _kept_on_cpu(before: struct_rusage, runtime: float) -> bool:
    """Whether the task run since ``before`` (this thread's `getrusage`) kept the thread
    on the CPU: it never waited of its own accord (a sleep, I/O, the GIL taken by another
    thread), or it used the CPU at least half its time. Not the CPU time alone: on a
    machine with more busy processes than cores, a task that never waits may run only
    half the time it takes, and that is still a task that would keep the GIL."""
    after = getrusage(RUSAGE_THREAD)
    if after.ru_nvcsw == before.ru_nvcsw:
        return True
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return cpu >= runtime / 2


class Watcher:
    """While the main thread runs tasks, a thread that reads what the executor sends: more
    tasks to wait behind the running one, ``Revoke`` for some of those (another worker is
    free, or a `cancel` wants one back and waits for the answer), a request for the stacks.
    So the answer comes within `WATCH_AFTER` and a round trip, not after the running task.

    It starts reading once a stretch of tasks has run for `WATCH_AFTER`: the main thread arms
    a kernel timer when a stretch starts, and the watcher, woken by it, reads only if that
    stretch still runs and is due (waking the watcher and putting it back to sleep for every
    task cost a quarter of a round trip, in a fight for the GIL with the task and its
    result). A stretch that ends early in its wait leaves the timer running, and the
    stretches that start before it fires use it as it is (the watcher, woken for an earlier
    one, sets it again for the one that runs, if any): arming and disarming a timer are a
    system call each, and on a virtual machine the two cost as much as sending the result
    (a fifth of a quick task's time in the worker, measured). So quick tasks with waits for
    the executor between them (a round trip after another) cost one arming and one wake-up
    of the watcher (with nothing to do) per `WATCH_AFTER`, not two system calls each.

    After a task that kept its thread on the CPU at least half its time (it held the GIL),
    the stretch ends: the main thread reads between such tasks, since the watcher could read
    only by taking the GIL from the next. Such a stretch, or one that ran a good part of its
    wait, disarms the timer as it ends, so the watcher never wakes in the next such task.
    A task the executor sends nothing to wait behind (`Tasks.alone`: its length is unknown
    or long) can only be asked for its stack: the watcher starts after `WATCH_ALONE`, so a
    task of tens of milliseconds wakes no second thread either."""

    def __init__(self, fileno: Callable[[], int], take_in: Callable[[], None]) -> None:
        self._fileno = fileno  # the link's descriptor, asked for when it is first read
        self._take_in = take_in
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._timer = OneShot()
        self._lock = threading.Lock()  # the flags and times below, set from either thread
        self._armed = False  # a stretch runs: the watcher reads once it is due
        self._on = False  # the watcher reads the link
        self._due = 0.0  # (monotonic) when the stretch that runs is due to be watched
        self._wait = 0.0  # ...after how long a wait
        self._fires: float | None = None  # when the timer fires, if it runs (from either)
        threading.Thread(target=_guard(self._run), name="fiberexec-watcher",
                         daemon=True).start()

    def watch(self, after: float = WATCH_AFTER) -> None:
        """(Main thread) A task starts: read from ``after`` seconds on, unless a stretch
        runs already (its start counts) or that began."""
        if self._armed or self._on:  # only this thread sets them from False
            return
        with self._lock:
            now = time.monotonic()
            self._armed, self._due, self._wait = True, now + after, after
            if self._fires is None or self._fires > self._due:  # (else it is woken first)
                self._timer.arm(after)
                self._fires = self._due if self._timer.exact else None

    def unwatch(self, *, idle: bool = False) -> None:
        """(Main thread) About to read the link itself: the stretch ends. ``idle``: it waits
        for the executor now, with no task to run, so the timer may run on if the stretch
        was short (when it fires, this thread most likely waits, or runs a quick task: the
        watcher takes the GIL from no one)."""
        if self._armed or self._on:
            with self._lock:
                if self._on:
                    self._on = False
                    os.eventfd_write(self._wake, 1)
                elif self._armed:
                    self._armed = False
                    if not idle or self._due - time.monotonic() < self._wait * 3 / 4:
                        self._timer.disarm()
                        self._fires = None

    def _run(self) -> None:
        idle = select.poll()
        idle.register(self._timer.fileno(), select.POLLIN)
        busy: select.poll | None = None
        link = -1
        while True:
            idle.poll()  # the timer fires: no timeout needed
            self._timer.drain()
            with self._lock:
                self._fires = None
                if not self._armed:  # the stretch it was set for ended, and none runs
                    continue
                left = self._due - time.monotonic()
                if left > 0 and self._timer.exact:  # set for an earlier stretch
                    self._timer.arm(left)
                    self._fires = self._due
                    continue
                self._on = True  # before `_armed` drops: the main thread's unlocked
                self._armed = False  # checks see one of them set throughout
            if busy is None:
                busy, link = select.poll(), self._fileno()
                busy.register(link, select.POLLIN)
                busy.register(self._wake, select.POLLIN)
            while self._on:
                ready = {fd for fd, _ in busy.poll()}  # unwatch() wakes it: no timeout
                if self._wake in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                if link in ready and self._on:
                    self._take_in()


class _Functions:
    """The functions one Tasks message carries, unpickled once, on first use (those pickled
    by value are kept across messages by their bytes: `fiberexec._functions`).

    One of the script's functions reads the globals on ``__main__``'s namespace, where each
    such function puts the caller's values it brought; so where another put its own since
    (two maps' functions in one message, each with its value of ``SCALE``), this one is
    looked up again, and puts its values back (`_functions.load`)."""

    def __init__(self, payloads: Sequence[Payload]) -> None:
        self.payloads = payloads
        self.cache: list[tuple[Any, int] | None] = [None] * len(payloads)

    def get(self, index: int) -> Any:
        kept = self.cache[index]
        if kept is not None and kept[1] == _mainspace.placings:
            return kept[0]
        fn = _functions.load(self.payloads[index])
        self.cache[index] = (fn, _mainspace.placings)
        return fn


def _ready_for_a_full_address_space() -> None:
    """Under an address-space limit (``memory=``), load what a thread's exit needs now:
    glibc loads ``libgcc_s`` when a thread first exits, and where the task has filled the
    address space it cannot, and aborts the whole process ("libgcc_s.so.1 must be installed
    for pthread_exit to work"): a `MemoryError` became a lost worker and a retried task."""
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        return
    import ctypes

    with contextlib.suppress(OSError):  # not there: nothing to load, nothing to fail
        ctypes.CDLL("libgcc_s.so.1")


def _note_memory_limit(exc: MemoryError) -> None:
    """A `MemoryError` under an address-space limit says which limit, and how to raise it."""
    import resource

    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY:
        exc.add_note(f"this worker's address space is limited to {limit} bytes (RLIMIT_AS, "
                     f"set from memory=): raise memory= or allocate less")


def _settle_output() -> None:
    """Do what a normal exit would do for the output this process has written, before
    saying it is ending: run the exit handlers (they flush logging's handlers and wait for
    multiprocessing queues' feeder threads, as a stdlib worker's exit does), then flush
    stdio. Bounded: a handler blocked on a reader that is gone costs `SETTLE_TIMEOUT`.

    Not pynng's: it tears nng down, and with it a network link to the executor this worker
    has yet to say why it ends on (the process ends with ``os._exit``, which needs no
    teardown)."""
    nng = sys.modules.get("pynng.nng")
    with contextlib.suppress(AttributeError):
        atexit.unregister(nng._pynng_atexit)  # type: ignore[union-attr]
    runner = threading.Thread(target=atexit._run_exitfuncs, name="fiberexec-settle",
                              daemon=True)
    runner.start()
    runner.join(SETTLE_TIMEOUT)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _task_threads() -> list[threading.Thread]:
    """The threads tasks started that are not daemons (this worker's own are)."""
    skip = (threading.current_thread(), threading.main_thread())
    return [t for t in threading.enumerate() if not t.daemon and t not in skip]


def _when_stopped(signum: int, frame: object) -> None:
    """SIGTERM while threads tasks started run: they finish (bounded), then SIGTERM ends
    this process as it would have at once."""
    _finish_what_tasks_left()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _finish_what_tasks_left() -> None:
    """As the standard library's workers do when they end: run `multiprocessing`'s exit
    hooks (a stdlib queue a task put to is flushed, the task's children are joined, daemonic
    ones terminated), then wait for the threads tasks started that are not daemons (a
    write in the background completes), and let the brokers of the
    `fiberexec.multiprocessing` queues and pipes the tasks sent to read all of it
    (`_stream.settle_all`). Bounded by `THREADS_WAIT` (the stdlib's wait has no bound).
    Meanwhile SIGTERM, the executor's stop at shutdown, is ignored: the stop's SIGKILL after
    its grace still ends this process."""
    threads = _task_threads()
    std = sys.modules.get("multiprocessing.util")
    ours = sys.modules.get("fiberexec.multiprocessing._process")
    streams = sys.modules.get("fiberexec.multiprocessing._stream")
    finalizers = std is not None and bool(getattr(std, "_finalizer_registry", None))
    if not (threads or finalizers or ours is not None or streams is not None
            or multiprocessing.active_children()):
        return
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def finish() -> None:
        with contextlib.suppress(Exception):
            if std is not None:
                std._exit_function()
        with contextlib.suppress(Exception):
            if ours is not None:
                ours.join_children()
        for thread in threads:
            thread.join()
        with contextlib.suppress(Exception):
            if streams is not None:
                streams.settle_all()

    runner = threading.Thread(target=finish, name="fiberexec-finish", daemon=True)
    runner.start()
    runner.join(THREADS_WAIT)


_probe = ""  # the name of this worker's handshake probe, until the handshake ends


def _forget_probe() -> None:
    """Unlink the handshake's probe and claim board names, if any are left."""
    global _probe
    if _probe:
        _shm.discard(_probe)
        _claims.unlink(_probe)
        _probe = ""


def _die(code: int, why: str) -> NoReturn:
    _forget_probe()  # (a handshake cut short: nobody else unlinks them)
    if not code:  # an orderly end: what the tasks left running finishes first
        _finish_what_tasks_left()
    _shm.drop_pool()  # what this worker sent and a receiver still maps stays mapped there
    if code:  # the worker's own stderr (the backend keeps it), captured or not
        print(f"fiberexec worker: {why}", file=sys.__stderr__, flush=True)
    if not _captured:  # a captured stream's lock may be held by a thread waiting on ours
        with contextlib.suppress(Exception):
            sys.stdout.flush()
    os._exit(code)


_captured = False  # sys.stdout and sys.stderr feed a Capture


def _guard(loop: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            loop()
        except BaseException as exc:  # the link is this worker's lifeline: no link, no worker
            _die(EXIT_NO_EXECUTOR, f"sending to the executor failed: {exc!r}")

    return run


def _adopt_authkey() -> None:
    """Run with the parent's multiprocessing authkey, as a stdlib child process does."""
    key = os.environ.pop(_contract.ENV_MP_AUTHKEY, None)
    if key:
        multiprocessing.current_process().authkey = bytes.fromhex(key)


def _off_the_terminal() -> None:
    """A worker (and the launcher) runs in the caller's session but not in the terminal's
    foreground group: with ``stty tostop`` a write to the terminal would stop it (SIGTTOU),
    and a read from it would (SIGTTIN). As a process with no terminal, it writes; a read
    fails. (A forked `fiberexec.multiprocessing.Process`, in the foreground group, gets
    the defaults back.)"""
    for name in ("SIGTTOU", "SIGTTIN"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def main() -> None:
    """Entry point of ``python -m fiberexec.worker``; with ``--launcher FD``, the forking
    launcher (`fiberexec._launcher`), whose forked children each call `run`."""
    _off_the_terminal()
    if sys.argv[1:2] == ["--launcher"]:
        from fiberexec import _launcher

        _launcher.serve(int(sys.argv[2]))
        return
    run()


def run() -> None:
    """Be a worker: configured by the environment, until the executor lets go."""
    try:
        config = _Config(os.environ)  # a few names read, not the whole environment copied
    except KeyError as exc:
        sys.exit(f"fiberexec worker: missing environment variable {exc}; backends set it")
    except ConfigurationError as exc:
        sys.exit(f"fiberexec worker: {exc}")
    _adopt_authkey()
    # before anything of the user's loads a numerical library, which reads them once
    _threads.limit(os.environ)
    # As a stdlib pool's worker is "SpawnProcess-3" (logging's processName), not the
    # "MainProcess" every worker would be
    multiprocessing.current_process().name = f"FiberWorker-{config.worker_id}"
    _procstate.adopt_tracker()  # a new process: its parent named its tracker's pipe, if any
    _ready_for_a_full_address_space()
    origin = _syspath.adopt(os.environ.get(_syspath.ENV_SYS_PATH))  # before any unpickling
    _mainspace.install(origin)  # the caller's script's names, not this program's (see there)
    _import_hooks.install()  # joblib's "fiber" backend; shared memory attached untracked
    try:
        worker = Worker(config)
    except LinkClosed as exc:
        _die(EXIT_NO_EXECUTOR, str(exc))
    try:
        setup = worker.handshake()
    except ProtocolError as exc:
        _die(EXIT_AUTH_FAILED, f"handshake failed: {exc}")
        return
    worker.outbox.beat()  # the executor knows its resource use before anything else
    worker.redirect_output(setup.output)
    # A task that crashes the interpreter (a fault in native code) says where, as loky's
    # workers do: on the worker's own stderr (the terminal, or the backend's log).
    faulthandler.enable(sys.__stderr__ or sys.stderr, all_threads=False)
    signal.signal(signal.SIGINT, worker.on_sigint)  # (an initializer may set its own)
    worker.outbox.open(worker.heartbeat, worker.silence)
    worker.run_initializer(setup)
    worker.serve()
    worker.leave(0, "done")


if __name__ == "__main__":
    main()
