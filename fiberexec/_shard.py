"""A shard of the task scheduler: one thread that owns a queue, a pending table and its workers.

Data flow (all of it on the shard's thread, except where noted)::

    FiberExecutor.submit --put()--> incoming ---+
    supervisor / nng / backend --post(Event)--> events ---+--> wake fd
                                                          |
    run(): step() until shut down and drained
      step(): select(channels + wake fd, next deadline)
             -> _receive: handshake | results -> futures | heartbeats
             -> _handle_events: `fiberexec._events`, matched by type
             -> _dispatch: queue --(credit)--> Tasks messages to workers
             -> _housekeep: heartbeats, silent workers, start deadlines, idle scale-down

Everything mutable here is touched only by the shard's thread; other threads hand it work
through `put` and `post`, which append to a deque and wake the thread if it is asleep. A shard
is built from a frozen `Session`, reports to a `Lifecycle`, reads time from the clock it is
given, and talks to workers through `Link`s: so it can be driven step by step in a unit test
with a fake clock and fake channels, and no process at all.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures._base import CANCELLED
from functools import partial
from itertools import islice
from typing import Any, cast

from fiberexec import _auth, _claims, _future, _imports, _interrupts, _observe, _shm
from fiberexec import _events as ev
from fiberexec import _protocol as p
from fiberexec._argcache import Mirror, Tally
from fiberexec._backend import WorkerHandle, WorkerStatus
from fiberexec._claims import ClaimBoard
from fiberexec._conn import LONG_TASK, MAX_WINDOW, Conn, State
from fiberexec._crash import Loss, loss_line, lost_message, phrase_of
from fiberexec._errors import (
    AuthenticationError,
    PicklingError,
    ProtocolError,
    SerializationError,
    WorkerLostError,
)
from fiberexec._functions import kept_functions
from fiberexec._future import CANCEL_WAIT, Answer, TaskFuture
from fiberexec._losslog import LossLog
from fiberexec._observe import DURATION_BOUNDS
from fiberexec._poller import Poller
from fiberexec._serialize import (
    Payload,
    by_value_needed,
    dumps,
    dumps_function,
    dumps_scalars,
    loads_exception,
    remote_traceback,
    script_objects,
)
from fiberexec._session import Lifecycle, Session
from fiberexec._task import (
    WorkItem,
    function_key,
    name_task,
    settle,
    span_function,
)

log = logging.getLogger("fiberexec")
STATUS_WAIT = 3.0  # seconds to wait for a lost worker's exit status before failing its task
STEAL_MIN = 8
REVOKE_SCAN = 0.005  # seconds between looks for a worker holding tasks another could run
MOVE_COST = 0.0003  # seconds a held task moved to an idle worker needs to get there
EXIT_START_GRACE = 5.0  # at interpreter exit, seconds to wait for a first worker to connect
ESTIMATES_MAX = 4096  # functions whose run times are remembered
# A caller waiting for answers it reads itself (`Shard.collect`) polls its workers' links for
# up to SPIN seconds before it sleeps, when each answer is due soon: what the worker holds is
# estimated to run no longer than SPIN, and the shortest round trip seen on its link is under
# SPIN_NEAR (a worker on this host, or a near one). Its CPU stays awake (a sleeping vCPU's
# wake-up, and the colder code after it, were about half of a no-op task's round trip here);
# a longer task, or a far worker, is waited for asleep.
SPIN = 0.00015
SPIN_NEAR = 0.001
TRUST_MAX = MAX_WINDOW.bit_length()  # results as estimated after which the window is whole


class Shard:
    def __init__(
        self,
        session: Session,
        index: int,
        lifecycle: Lifecycle,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.config = session.config
        self.index = index
        self.lifecycle = lifecycle
        self.clock = clock
        # Where the clock stands against the wall clock, fixed once: a time shown (a span, a
        # start) is then the same at every look, not recomputed with the moment of looking.
        self.wall_offset = time.time() - clock()
        self.peers: Sequence[Shard] = (self,)  # the executor's shards, this one included
        self.incoming: deque[WorkItem] = deque()
        self.events: deque[ev.Event] = deque()
        self.queue: deque[WorkItem] = deque()
        self.conns: dict[str, Conn] = {}
        self.hungry: dict[str, Conn] = {}  # ready workers that may have credit; dispatch order
        self.idle: dict[str, Conn] = {}  # hungry workers holding no task: served first
        self.holders: dict[str, Conn] = {}  # workers sent a task behind another (may be stale)
        self.ready_workers = 0  # read by other shards deciding whether to steal
        self._next_housekeeping = 0.0
        self._judge_after = 0.0  # no silence is judged before this (see _may_judge_silence)
        self.selector: Poller[Conn | None] = Poller()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # closed with the shard object, never earlier: a late wake must not hit a reused fd
        weakref.finalize(self, os.close, self._wake_fd)
        self.selector.register(self._wake_fd, None)
        self._sleeping = False
        # Held by the shard's thread except while it sleeps in select: a submitting thread
        # that takes it then may dispatch to an idle worker itself (see `put`).
        self.owner = threading.Lock()
        # The threads that answer `ask_back` (its loop's, or a submitter dispatching here):
        # a cancel from one of them cannot wait for the answer.
        self._thread_ident: int | None = None
        self._owner_ident: int | None = None
        self._owned = False  # run() holds `owner` (a test driving step() does not)
        self.shutting_down = False
        self.broken: BaseException | None = None  # once set, every task that arrives fails
        self.stealing = False
        self.estimates: dict[str, float] = {}  # function key -> smoothed run time, seconds
        self.by_value_args: set[str] = set()  # keys whose last arguments had the script's
        self.exit_deadline: float | None = None  # the interpreter is exiting: see _housekeep
        self.done = self.failed = self.retried = self.lost = self.rejected = self.stolen = 0
        self.bytes_sent = self.bytes_received = 0  # frames over the workers' links
        self.arg_tally = Tally()  # large arguments kept by workers, and bytes that saved
        self.left_open: dict[str, ev.Link] = {}  # endpoints of workers starting at close
        self.items_done = self.items_failed = 0  # what done/failed carried: map items count
        self.losses = LossLog()
        self._next_revoke_scan = 0.0
        self._revoke_at = math.inf  # when a worker's running task may start to hold others up
        # Results of a function in a row that came back as estimated (see _allowance).
        self.trusted: dict[str, int] = {}
        # What workers(), task_spans() and failures() read (see `fiberexec._observe`).
        self.spans: deque[_observe.SpanRecord] = deque(maxlen=_observe.SPANS_MAX)
        self.failures: deque[_observe.FailureRecord] = deque(maxlen=_observe.FAILURES_MAX)
        self.gone: deque[Conn] = deque(maxlen=_observe.GONE_MAX)
        # Every finished task's run time, counted per bucket of _observe.DURATION_BOUNDS
        # (the spans above keep only the newest).
        self.duration_counts = [0] * len(_observe.DURATION_BOUNDS)
        self.duration_total = 0.0
        self.wall_offset = time.time() - clock()  # the clock's readings as time.time()
        self._stack_ids = 0
        self.thread = threading.Thread(
            target=self.run, name=f"fiberexec-shard-{index}", daemon=True
        )

    # ------------------------------------------------------------ other threads

    def put(self, item: WorkItem) -> None:
        self.incoming.append(item)
        if self._sleeping and not self._dispatch_here() and self._could_act():
            self._wake()

    def put_all(self, items: list[WorkItem]) -> None:
        """`put` each, dispatched together: each idle worker gets its share in one message."""
        self.incoming.extend(items)
        if self._sleeping and not self._dispatch_here() and self._could_act():
            self._wake()

    def _could_act(self) -> bool:
        """(Another thread, the shard's sleeping.) Whether its thread, woken for a task put
        now, could do anything with it: a worker may take one, another shard may take it
        away, a worker holds tasks behind a running one (a queue makes the shard watch for
        one that overstays), or the executor broke or is shutting down. Else it sleeps on:
        what it waits for, a worker connecting or finishing a task, wakes it (its socket),
        and that turn takes in what was put meanwhile. (Waking it for each task submitted
        before any worker had connected cost the submitting thread a thread switch a task,
        and the shard a turn that sent nothing.) A thread that lets go of the shard's loop
        after reading (`collect`) wakes it when something was put meanwhile: this reads the
        shard's state after putting, that one reads ``incoming`` after its read, so one of
        the two sees the other's."""
        return bool(self.hungry or self.holders or self.broken is not None
                    or self.shutting_down or len(self.peers) > 1)

    def _dispatch_here(self) -> bool:
        """On the submitting thread: while the shard's thread sleeps and a worker is idle,
        send the task from here, saving a thread hand-off on the way out. Only then: under
        a flood the shard's thread pickles and sends, and the caller goes on submitting."""
        if not self.owner.acquire(blocking=False):
            return False
        self._owner_ident = threading.get_ident()
        held = None
        _future.deferring()  # a task failing here: its callbacks run on the shard's thread
        try:
            if not (self._sleeping and self._has_idle_worker()) or self.events:
                return False
            held = _interrupts.hold()  # no Ctrl-C between taking a task and sending it
            self._take_incoming()
            self._dispatch()
            return not self.queue  # what could not be sent here, the shard's thread sends
        finally:
            self._owner_ident = None
            self.owner.release()
            self._hand_over_callbacks()
            if held is not None and held.came and self.queue:
                self._wake()  # the caller hears of Ctrl-C, not of what is left to send
            _interrupts.release(held)

    def _hand_over_callbacks(self) -> None:
        """After standing in for the shard's thread: it runs the done-callbacks of the
        futures settled meanwhile (see `_future.deferring`)."""
        run = _future.deferred()
        if run is not None:
            self.post(ev.Call(run))

    def on_its_thread(self) -> bool:
        """Whether the calling thread runs the shard's loop, or holds it (a submitting or
        waiting thread: see `_dispatch_here`, `collect`), as in a done-callback it calls."""
        me = threading.get_ident()
        return me in (self._thread_ident, self._owner_ident)

    def _has_idle_worker(self) -> bool:
        return bool(self.idle)

    def collect(self, keys: Sequence[object], done: Callable[[], bool], timeout: float) -> None:
        """On a thread about to wait for futures whose tasks were sent to their workers
        (``keys``) while the shard's thread slept: if it still sleeps, read those workers'
        answers on this thread and take them in here, until ``done()`` or for at most
        ``timeout`` seconds. That saves the round trip's last thread hand-off (the shard's
        thread waking to read the answer, then waking this one), as `_dispatch_here` saves
        the first.

        Meanwhile the shard's thread cannot act (this thread holds `owner`), so this thread
        lets go as soon as anything else wants it: a frame from another worker, a submit or
        an event (whatever would wake the shard's thread: its selector becomes readable),
        or the shard's next deadline."""
        if not self.owner.acquire(blocking=False):
            return
        self._owner_ident = threading.get_ident()
        held = None
        _future.deferring()  # callbacks run on the shard's thread, as the stdlib's on its own
        try:
            if not self._sleeping or self.events or self.incoming or done():
                return
            conns: dict[int, Conn] = {}
            for key in keys:
                conn = cast("Conn", key)
                if (conn.state is State.READY and not conn.channel.closed
                        and self.conns.get(conn.worker_id) is conn):
                    conns[conn.channel.fileno()] = conn
            if not conns:
                return
            # No Ctrl-C between reading results off the socket and settling their futures
            # (nor while the links are off the selector): it waits until this returns.
            held = _interrupts.hold()
            for fd, conn in conns.items():
                self.selector.unregister(fd)  # the shard's thread sleeps on, not woken by it
                conn.collected = True
            try:
                self._collect(conns, done, min(timeout, self._next_deadline()))
            finally:
                for fd, conn in conns.items():
                    if conn.collected:  # (else it was unregistered meanwhile, for good)
                        conn.collected = False
                        self.selector.register(fd, conn)
            if self.queue:  # the answer freed the worker: send what waits, as the shard would
                self._dispatch()
            if self.queue or self.events or self.incoming:
                self._wake()
        finally:
            self._owner_ident = None
            self.owner.release()
            self._hand_over_callbacks()
            _interrupts.release(held)

    def _collect(self, conns: dict[int, Conn], done: Callable[[], bool], timeout: float) -> None:
        poller = select.poll()
        for fd in conns:
            poller.register(fd, select.POLLIN)
        poller.register(self.selector.fileno(), select.POLLIN)  # the shard's thread is wanted
        now = time.monotonic()
        deadline = now + timeout
        quick = all(conn.unknown == 0 and conn.load <= SPIN and conn.rtt < SPIN_NEAR
                    for conn in conns.values())
        spin_until = min(deadline, now + SPIN) if quick else now
        while not done():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return
            spinning = now < spin_until
            ready = poller.poll(0 if spinning else math.ceil(left * 1000))
            if not ready:
                if spinning:
                    continue  # (the poll let go of the interpreter's lock meanwhile)
                return
            wanted = bool(self.events)
            for fd, _ in ready:
                conn = conns.get(fd)
                if conn is None:
                    wanted = True  # the rest is the shard's thread's to do
                elif conn.collected:
                    self._receive(conn)
                    if not conn.collected:  # it left (its link closed): not read again
                        poller.unregister(fd)
            # Tasks wait in the queue (a worker this read freed may take them): `collect`
            # sends them as it lets go, and the shard's thread does the rest.
            if wanted or self.queue or not any(conn.collected for conn in conns.values()):
                return

    def post(self, event: ev.Event) -> None:
        self.events.append(event)
        if self._sleeping:
            self._wake()

    def _wake(self) -> None:
        os.eventfd_write(self._wake_fd, 1)

    def request_stack(self, worker_id: str) -> Future[str]:
        """Ask ``worker_id`` for its threads' stacks; the future holds its answer (or a
        `LookupError` if the shard does not serve it, or it leaves before answering)."""
        future: Future[str] = Future()
        self.post(ev.Call(lambda: self._request_stack(worker_id, future)))
        return future

    def _request_stack(self, worker_id: str, future: Future[str]) -> None:
        conn = self.conns.get(worker_id)
        if conn is None or conn.state not in (State.READY, State.RETIRING):
            future.set_exception(LookupError(f"worker {worker_id} is not connected"))
            return
        self._stack_ids += 1
        conn.stack_requests[self._stack_ids] = future
        self._send(conn, p.DumpStack(self._stack_ids))

    @property
    def backlog(self) -> int:
        """Tasks not yet running: queued here, or sent ahead to a worker behind its task;
        not those cancelled while they waited in the queue (dropped when their turn comes).
        A chunked map's items count one by one, as in `Stats`."""
        waiting = [*self.queue, *self.incoming]  # (copies: the shard's thread changes them)
        return (sum(item.items for item in waiting if item.future._state != CANCELLED)
                + sum(item.items for item in self._held() if not item.started))

    @property
    def running(self) -> int:
        """Tasks started (or next to start) at a worker; a chunk's items one by one."""
        return sum(item.items for item in self._held() if item.started)

    def _held(self) -> list[WorkItem]:
        return [item for c in list(self.conns.values()) for item in list(c.inflight.values())]

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        self.owner.acquire()
        self._owned = True
        self._thread_ident = threading.get_ident()
        try:
            while not self.finished():
                self.step()
        except BaseException as exc:  # a bug here must not leave futures hanging
            log.exception("fiberexec shard %d crashed", self.index)
            self.lifecycle.break_executor(f"the scheduler thread crashed: {exc!r}", exc)
            self._fail_everything(exc)
        finally:
            self.close()
            self._owned = False
            self.owner.release()

    def step(self, timeout: float | None = None) -> None:
        """One turn of the loop; waits at most ``timeout`` (default: the next deadline)."""
        self._wait(timeout)
        self._handle_events()
        self._take_incoming()
        self._dispatch()
        if self.clock() >= self._next_housekeeping:
            self._housekeep()

    def _wait(self, timeout: float | None) -> None:
        self._sleeping = True
        if self.incoming or self.events:
            timeout = 0.0
        elif timeout is None:
            timeout = self._next_deadline()
        if self._owned:
            self.owner.release()
        try:
            ready = self.selector.select(timeout)
        finally:
            if self._owned:
                self.owner.acquire()
        self._sleeping = False
        for conn, _ in ready:
            if conn is None:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
            else:
                self._receive(conn)

    def _next_deadline(self) -> float:
        wake = self._next_housekeeping
        if (self.idle or self.queue) and self._revoke_at < wake:
            wake = max(self._revoke_at, self._next_revoke_scan)
        return max(0.0, wake - self.clock())

    def finished(self) -> bool:
        """Shut down, and nothing is left to run or to hear about: no task out, no task
        that ran out of retries still awaiting its worker's exit status to fail with, and
        (unless the executor broke) no worker still in its initializer, or starting to run
        it, which a stop would cut short (the stdlib's workers finish theirs too)."""
        if not self.shutting_down or self.queue or self.incoming or self.events:
            return False
        if self._initializers_to_come():
            return False
        return not any(c.inflight or c.doomed or (c.initializing and c.state is State.READY
                                                  and self.broken is None)
                       for c in self.conns.values())

    def _initializers_to_come(self) -> bool:
        """Workers started before the shutdown will run the initializer, as a stdlib pool's
        do even when no task comes: wait for them to connect (or fail to start)."""
        return (self.session.initializer is not None and self.broken is None
                and self.lifecycle.starting(self.index) > 0)

    # ------------------------------------------------------------ receiving

    def _receive(self, conn: Conn) -> None:
        while not conn.channel.closed and (msg := conn.channel.try_recv()) is not None:
            conn.last_recv = self.clock()
            self.bytes_received += len(msg.bytes)
            if conn.state in (State.READY, State.RETIRING) and msg.pipe.id == conn.pipe_id:
                if conn.setup_sent:  # its first word, sent as the Setup came: a round trip
                    conn.measured_rtt(conn.last_recv - conn.setup_sent)
                    conn.setup_sent = 0.0
                self._on_frame(conn, msg.bytes)
            else:
                self._handshake(conn, msg)

    def _on_frame(self, conn: Conn, frame: bytes) -> None:
        try:
            message = p.decode(frame, allow_shm=conn.shm)
        except ProtocolError as exc:
            self._reject(conn, None, f"malformed message: {exc}")
            return
        if isinstance(message, p.Results):
            self._on_results(conn, message.results)
        elif isinstance(message, p.Initialized):
            conn.initializing = False
        elif isinstance(message, p.Bye):
            self._stop_serving(conn, conn.leaving or message.reason)
            self._hang_up(conn)
        elif isinstance(message, p.InitFailed):
            conn.initializing = False
            self._on_init_failed(conn, message.error)
            self._hang_up(conn)
        elif isinstance(message, p.Revoked):
            self._on_revoked(conn, message.task_ids)
        elif isinstance(message, p.Imported):  # (sent by a worker on this host)
            _imports.learn(message.modules)
        elif isinstance(message, p.Heartbeat):
            conn.cpu_percent, conn.rss_bytes = message.cpu_percent, message.rss_bytes
            if message.stdout or message.stderr:
                self.lifecycle.output(conn.worker_id, conn.host, message.stdout,
                                      message.stderr)
        elif isinstance(message, p.Stack):
            future = conn.stack_requests.pop(message.request_id, None)
            if future is not None and not future.done():
                future.set_result(message.text)

    def _on_results(self, conn: Conn, results: Sequence[p.Result]) -> None:
        now = self.clock()
        worker_id, spans, counts = conn.worker_id, self.spans, self.duration_counts
        for result in results:
            item = conn.inflight.pop(result.task_id, None)
            if item is None:
                self.rejected += 1
                log.warning("worker %s sent a result for unknown task %d",
                            conn.worker_id, result.task_id)
                continue
            conn.release(item.cost)
            self._learn(item.key, result.runtime)
            if conn.timed is not None and conn.timed[0] == result.task_id:
                conn.measured_rtt(now - conn.timed[1] - result.runtime)
            for name in item.shm_names:
                _shm.discard(name)
            if not item.start():  # cancelled while it waited there: its outcome is dropped
                continue
            _future.answered(item.future)
            ok = settle(item, result)
            items = self._count(item, ok)
            runtime = result.runtime
            spans.append((item.task_id, worker_id, span_function(item), now - runtime, now, ok))
            counts[bisect_left(DURATION_BOUNDS, runtime)] += 1
            self.duration_total += runtime
            if ok:  # (map items, as stats() counts them)
                conn.tasks_done += items
            else:
                conn.tasks_failed += items
                self._record_failure(item, worker_id)
        conn.overstaying = False
        conn.head_since = self.clock()  # the next one it holds starts now
        if conn.inflight:  # the task it held behind those starts now
            next(iter(conn.inflight.values())).start()
        if conn.state is State.READY:
            self.hungry[conn.worker_id] = conn
            if not conn.inflight:
                self.idle[conn.worker_id] = conn
        if not conn.inflight:
            conn.idle_since = self.clock()
        self.lifecycle.progress()

    def _record_failure(self, item: WorkItem, worker_id: str | None) -> None:
        """Keep a failed task for failures() (described only when someone asks)."""
        exc = item.future.exception(timeout=0)
        if exc is not None:
            self.failures.append((item, worker_id, exc, self.clock(), exc.__traceback__))

    def _on_revoked(self, conn: Conn, task_ids: Iterable[int]) -> None:
        """Tasks the worker gave back unstarted go to the head of the queue, in order; one
        a `cancel` asked for is cancelled instead (the others it asked for had started)."""
        answers, overstay = conn.revokes.popleft() if conn.revokes else ({}, True)
        if overstay:
            conn.revoking = False
        # (One the executor took back from the board meanwhile is no longer held there.)
        given = [item for i in task_ids if (item := conn.inflight.pop(i, None)) is not None]
        self._requeue(conn, given, answers)
        for task_id, answer in answers.items():  # not given back: it had started there
            answer.give(False)
            if (item := conn.inflight.get(task_id)) is not None:
                item.start()

    def _take_back(self, conn: Conn, tail: list[WorkItem]) -> bool:
        """Take the tasks ``conn`` holds behind its running one off its claim board: those
        it has not started are the queue's again at once, with no answer from the worker
        (whose task may hold the GIL for long). False when the board cannot tell now."""
        assert conn.claims is not None
        numbers = conn.claims.take_back(item.number for item in tail)
        if numbers is None:
            return False
        taken = [item for item in tail if item.number in numbers]
        answers = {}  # cancels waiting for the worker's answer about one of those
        for item in taken:
            del conn.inflight[item.task_id]
            for pending, _ in conn.revokes:
                if (answer := pending.pop(item.task_id, None)) is not None:
                    answers[item.task_id] = answer
        self._requeue(conn, taken, answers)
        return True

    def _requeue(self, conn: Conn, given: list[WorkItem], answers: dict[int, Answer]) -> None:
        """Tasks ``conn`` no longer holds, unstarted, go to the head of the queue in order;
        one a `cancel` asked for (in ``answers``, which loses it) is cancelled instead."""
        back = []
        for item in given:
            conn.give_back(item.cost)
            item.requeued()
            answer = answers.pop(item.task_id, None)
            if (answer is not None and isinstance(item.future, TaskFuture)
                    and answer.cancel(item.future)):
                item.start()  # tells its waiters: `wait` and `as_completed` see it cancelled
                continue
            back.append(item)
        self.queue.extendleft(reversed(back))
        if conn.state is State.READY:
            self.hungry[conn.worker_id] = conn
            if not conn.inflight:
                self.idle[conn.worker_id] = conn

    def _maybe_revoke(self) -> None:
        """A worker holds tasks it has not started behind a long one (known long, or
        outrunning its estimate) while another idles, or tasks submitted after them wait
        in the queue: take those back (or ask for them), for whoever is free first."""
        now = self.clock()
        if now < self._next_revoke_scan:
            self._revoke_at = min(self._revoke_at, self._next_revoke_scan)  # look then
            return
        self._next_revoke_scan = now + REVOKE_SCAN
        holders = self.holders
        for worker_id in [w for w, c in holders.items() if len(c.inflight) < 2]:
            del holders[worker_id]  # no longer holds anything behind its current task
        victim = max(holders.values(), default=None,
                     key=lambda c: len(c.inflight) if self._hoards(c, now) else 0)
        if victim is None or not self._hoards(victim, now):
            # Look again when the first task held up there outruns its estimate: nothing
            # else may wake this thread before that task ends.
            self._revoke_at = min((self._overstays_at(c) for c in holders.values()),
                                  default=math.inf)
            return
        self._revoke_at = now + REVOKE_SCAN  # then look at the others
        head, *tail = victim.inflight.values()
        running = now - victim.head_since
        if running > self.estimates.get(head.key, 0.0):  # what it learned meanwhile
            self.estimates[head.key] = running
        victim.overstaying = True
        self.trusted[head.key] = 0
        if victim.claims is not None and self._take_back(victim, tail):
            return
        victim.revoking = True
        self._revoke(victim, [item.task_id for item in tail], {}, overstay=True)

    def _even_out(self) -> None:
        """The queue is empty and a worker idles while another holds tasks behind its
        running one (a map's last ones, say): move the held ones that would end sooner on
        the idle worker, so no worker runs a queue of its own while another waits. Taken
        off the claim board (no answer needed), from the end of what it holds, while the
        holder's work left before a task is more than the idle worker would need to end it,
        sending it there included (`MOVE_COST`)."""
        now = self.clock()
        for idle in list(self.idle.values()):
            victim, left = None, 0.0
            for conn in self.holders.values():
                movable = (conn.claims is not None and not conn.revoking
                           and len(conn.inflight) > 1 and conn.state is State.READY)
                if movable and (work := self._work_left(conn, now)) > left:
                    victim, left = conn, work
            if victim is None:
                return
            tail = list(victim.inflight.values())[1:]
            moved: list[WorkItem] = []
            load = MOVE_COST
            while tail and load + (cost := max(tail[-1].cost, 0.0)) < left:
                left -= cost
                load += cost
                moved.append(tail.pop())
            if not moved or not idle.admits(moved[-1].cost):
                continue
            moved.reverse()
            if not self._take_back(victim, moved):
                continue
            self._send_tasks(idle, len(moved))

    def _work_left(self, conn: Conn, now: float) -> float:
        """Seconds of work ``conn`` holds, as estimated: its running task's rest and the
        tasks behind it."""
        head, *tail = conn.inflight.values()
        running = max(0.0, max(head.cost, 0.0) - (now - conn.head_since))
        return running + sum(max(item.cost, 0.0) for item in tail)

    def _hoards(self, conn: Conn, now: float) -> bool:
        return now > self._overstays_at(conn)

    def _overstays_at(self, conn: Conn) -> float:
        """When ``conn``'s running task, holding others up, counts as outrunning its
        estimate (-inf: it is known long; inf: it holds nothing up, or is being asked)."""
        if conn.state is not State.READY or conn.revoking or len(conn.inflight) < 2:
            return math.inf
        head = next(iter(conn.inflight.values()))
        expected = self.estimates.get(head.key, 0.0)
        if expected >= LONG_TASK:
            return -math.inf
        return conn.head_since + max(LONG_TASK, 2 * expected)

    def _count(self, item: WorkItem, ok: bool) -> int:
        """A task finished: count it (and, for stats, the map items it carried); those."""
        items = item.items
        if ok:
            self.done += 1
            self.items_done += items
        else:
            self.failed += 1
            self.items_failed += items
        return items

    def _learn(self, key: str, runtime: float) -> None:
        """A task of ``key`` ran ``runtime`` seconds: trust the estimate more (or start
        small again if it outran it: see `_allowance`), then move the estimate."""
        estimates, trusted = self.estimates, self.trusted
        old = estimates.get(key)
        if runtime > LONG_TASK and runtime > 2 * (old or 0.0):
            trusted[key] = 0  # outran its estimate
        elif (n := trusted.get(key, 0)) <= TRUST_MAX:
            trusted[key] = n + 1
        if old is None and len(estimates) >= ESTIMATES_MAX:
            estimates.clear()  # many distinct functions: start learning again
            trusted.clear()
        estimates[key] = runtime if old is None else 0.7 * old + 0.3 * runtime

    def _on_init_failed(self, conn: Conn, error: Payload) -> None:
        try:
            cause: BaseException = loads_exception(error)
        except SerializationError as exc:
            cause = exc
        self._stop_serving(conn, "its initializer failed")
        self.lifecycle.break_executor(
            "A worker initializer failed, the executor is not usable anymore", cause
        )

    # ------------------------------------------------------------ handshake

    def _handshake(self, conn: Conn, msg: Any) -> None:
        frame = msg.bytes
        try:
            if len(frame) > p.HANDSHAKE_MAX:
                raise ProtocolError(f"{len(frame)}-byte message before authentication")
            message = p.decode(frame)
            if conn.state is State.AWAIT_HELLO and isinstance(message, p.Hello):
                self._on_hello(conn, msg.pipe, message)
            else:
                raise ProtocolError(f"unexpected {type(message).__name__} in state {conn.state}")
        except ProtocolError as exc:
            self._reject(conn, msg.pipe, str(exc))

    def _on_hello(self, conn: Conn, pipe: Any, hello: p.Hello) -> None:
        """The worker's first message proves it holds the secret, over our nonce for it
        (given in its start request: one use) and its own; the answer proves we do."""
        if hello.worker_id != conn.worker_id:
            raise ProtocolError(f"worker id {hello.worker_id!r} is not {conn.worker_id!r}")
        secret = self.session.secret
        if not _auth.verify(_auth.proof(secret, "worker", hello.nonce, conn.nonce), hello.proof):
            raise AuthenticationError("wrong proof: the peer does not hold the secret")
        conn.pipe = pipe
        conn.host, conn.pid = hello.host, hello.pid
        conn.channel.bind(pipe)
        if hello.shm_probe:
            self._share_memory(conn, hello)
        conn.channel.seal()
        conn.state = State.READY
        conn.idle_since = self.clock()
        conn.setup_sent = conn.idle_since  # its first answer gives the link's round trip
        self.hungry[conn.worker_id] = conn
        self.idle[conn.worker_id] = conn
        conn.counted = True
        self.ready_workers += 1
        cfg = self.config
        self._send(conn, p.Setup(_auth.proof(secret, "executor", hello.nonce, conn.nonce),
                                 conn.shm, conn.claims is not None, cfg.heartbeat,
                                 cfg.silence_timeout, conn.max_tasks, self.session.initializer,
                                 self.session.output, cfg.arg_cache))
        conn.cache = Mirror(cfg.arg_cache, self.arg_tally) if cfg.arg_cache else None
        conn.initializing = self.session.initializer is not None
        self.lifecycle.worker_ready(conn.worker_id)
        log.info("worker %s connected (shared memory: %s)", conn.worker_id, conn.shm)

    def _share_memory(self, conn: Conn, hello: p.Hello) -> None:
        """Whether large buffers go through /dev/shm with this worker: we see its probe (so
        it sees our files), holding its proof (so it is this worker's), and it may read
        what we write there (it runs as our user, or as root); and whether its claim board
        maps here (we make its semaphore: see `fiberexec._claims`). The probe's and the
        board page's names go now: the worker has them open, or never will; the semaphore's
        stays for the worker to open (it unlinks it then, and so do we when we lose it)."""
        probe = hello.shm_probe
        if not (self.session.shm and probe.startswith(f"{_shm.PREFIX}{self.session.executor_id}-")):
            return  # (not ours to read, or to unlink)
        seen = _shm.check_probe(probe, p.PROOF_SIZE)
        if seen is not None and _auth.verify(hello.proof, seen[0]) and seen[1] in (os.getuid(), 0):
            conn.shm = True
            conn.claims = ClaimBoard.attach(probe)
        _shm.discard(probe)
        _claims.unlink(probe, semaphore=conn.claims is None)  # (the worker opens it first)

    def _reject(self, conn: Conn, pipe: Any, why: str) -> None:
        self.rejected += 1
        log.warning("rejected a message on worker %s's channel: %s", conn.worker_id, why)
        if (pipe is not None and pipe.id != conn.pipe_id) or conn.state is not State.READY:
            if pipe is not None:
                try:
                    pipe.close()
                except Exception:
                    pass
        else:
            self._lose(conn, f"worker {conn.worker_id} sent a malformed message ({why})")

    # ------------------------------------------------------------ events

    def _handle_events(self) -> None:
        while self.events:
            match self.events.popleft():
                case ev.Adopt() as adopt:
                    self._adopt(adopt)
                case ev.Started(worker_id, handle):
                    self._started(worker_id, handle)
                case ev.StartFailed(worker_id):
                    self._forget(self.conns.get(worker_id), lost=True)
                case ev.PipeDown(worker_id, pipe_id):
                    self._pipe_down(worker_id, pipe_id)
                case ev.Exited(worker_id, status, fault):
                    self._exited(worker_id, status, fault)
                case ev.Shutdown(cancel_futures):
                    self._shutdown(cancel_futures)
                case ev.Exiting():
                    self.exit_deadline = self.clock() + EXIT_START_GRACE
                    self._next_housekeeping = 0.0
                case ev.Broken(error):
                    # Keep running until shutdown(): a task submitted as we broke may arrive.
                    self.broken = error
                    self._take_incoming()
                case ev.Call(fn):
                    fn()
                case ev.Steal(thief):
                    self._give_away(thief)
                case ev.Stolen(items):
                    self.queue.extend(items)
                    self.stolen += len(items)
                    self.stealing = False

    def _adopt(self, adopt: ev.Adopt) -> None:
        worker_id, channel = adopt.worker_id, adopt.channel
        conn = Conn(worker_id, channel, self.config.max_tasks_per_child or 0, now=self.clock())
        conn.nonce = adopt.nonce
        self.conns[worker_id] = conn
        self.selector.register(channel.fileno(), conn)

    def _started(self, worker_id: str, handle: WorkerHandle) -> None:
        if (conn := self.conns.get(worker_id)) is not None:
            conn.handle = handle

    def _pipe_down(self, worker_id: str, pipe_id: int) -> None:
        conn = self.conns.get(worker_id)
        if conn is None or pipe_id != conn.pipe_id:
            return  # an unauthenticated peer hung up
        if conn.state is State.RETIRING and not conn.inflight:
            conn.state = State.DISCONNECTED
            conn.deadline = self.clock() + STATUS_WAIT
        elif conn.state in (State.READY, State.RETIRING):
            self._lose(conn, None)

    def _exited(self, worker_id: str, status: WorkerStatus, fault: str = "") -> None:
        conn = self.conns.get(worker_id)
        if conn is None:
            return
        conn.status, conn.fault = status, fault
        if conn.state is State.AWAIT_HELLO:
            self._forget(conn, lost=True)
            self.lifecycle.worker_failed_to_start(conn.worker_id, status)
        else:
            if conn.state in (State.READY, State.RETIRING):
                self._take_in(conn)  # what it sent before it exited counts: results, its Bye
            if conn.state is State.DISCONNECTED:
                self._finalize(conn)
            else:
                self._lose(conn, None)

    def _shutdown(self, cancel_futures: bool) -> None:
        self.shutting_down = True
        if cancel_futures:
            self._take_incoming()
            self.queue = self._cancel_queued()

    def _cancel_queued(self, *, everything: bool = False) -> deque[WorkItem]:
        """Cancel queued tasks, keeping what the standard library's call queue would hold
        (none with ``everything``).

        `ProcessPoolExecutor` moves up to ``max_workers + 1`` tasks into its call queue (and
        marks them running) as soon as they are submitted; ``cancel_futures`` cannot cancel
        those, so they still run. The same number, less what workers already hold, runs here.
        """
        held = sum(len(c.inflight) for c in self.conns.values())
        room = 0 if everything else max(0, self.config.max_workers + 1 - held)
        keep: deque[WorkItem] = deque()
        for item in self.queue:
            if item.started or (len(keep) < room and item.start()):
                keep.append(item)
            else:
                item.future.cancel()
                item.start()  # tells its waiters: `wait` and `as_completed` see it done
        return keep

    def interrupt(self) -> None:
        """(Its thread.) The program's Ctrl-C ends its use of the executor: what has not
        started is cancelled, and each running task is interrupted (`p.Interrupt`), as a
        terminal's Ctrl-C reaches a standard library worker, so none is waited for to its end.
        """
        self._take_incoming()
        self.queue = self._cancel_queued(everything=True)
        for conn in list(self.conns.values()):
            if conn.state is State.READY and conn.inflight:
                self._send(conn, p.Interrupt())

    def _give_away(self, thief: Shard) -> None:
        if not self.ready_workers:
            n = len(self.queue)  # no worker of ours can run them: hand over everything
        else:
            n = len(self.queue) // 2 if len(self.queue) >= STEAL_MIN else 0
        thief.post(ev.Stolen([self.queue.pop() for _ in range(n)][::-1]))

    # ------------------------------------------------------------ dispatch

    def _take_incoming(self) -> None:
        incoming, queue = self.incoming, self.queue
        while incoming:
            queue.append(incoming.popleft())
        if self.broken is not None:  # tasks submitted as the executor broke fail too
            self._fail_everything(self.broken)

    def _dispatch(self) -> None:
        if not self.queue:
            self._maybe_steal()
            if self.idle:
                self._maybe_revoke()
                if self.holders:
                    self._even_out()
            return
        if self._revoke_at <= self.clock():  # (with no holder left, it stops looking)
            self._maybe_revoke()  # what waits behind a task that overstays goes first
        hungry = self.hungry
        share = max(1, -(-len(self.queue) // max(1, len(hungry))))
        served: set[str] = set()  # each its share once a turn: an idle worker is hungry too
        for conns in (self.idle, hungry):  # a worker with nothing to do before any prefetch
            # Only as many workers as the queue needs are looked at, a few at a time (they
            # leave these dicts as they are served): with thousands idle, a task submitted
            # alone is sent without going through them all.
            while self.queue and (chunk := _unserved(conns, served, -(-len(self.queue) // share))):
                for worker_id, conn in chunk:
                    if not self.queue:
                        return
                    served.add(worker_id)
                    self._send_tasks(conn, share)
                    if self.queue and not self._admits(conn, self.queue[0]):
                        hungry.pop(worker_id, None)  # back once a result returns

    def _admits(self, conn: Conn, item: WorkItem) -> bool:
        key = item.key or function_key(item.fn)
        return conn.admits(self.estimates.get(key), self._allowance(key))

    def _allowance(self, key: str) -> int:
        """Slow start: how many tasks of ``key`` a worker may hold behind its running one.
        One per result of it that came back as estimated, doubling from there: one warm-up
        says little (its arguments may have been the quick ones)."""
        return min(MAX_WINDOW, 1 << max(0, self.trusted.get(key, 0) - 1))

    def _maybe_steal(self) -> None:
        if self.stealing or self.shutting_down or len(self.peers) == 1:
            return
        if not self.hungry:
            return
        victim = max(self.peers, key=lambda s: len(s.queue))
        worth_it = len(victim.queue) >= STEAL_MIN or (victim.queue and not victim.ready_workers)
        if victim is not self and worth_it:
            self.stealing = True
            victim.post(ev.Steal(self))

    def _send_tasks(self, conn: Conn, n: int) -> None:
        """Send ``conn`` up to ``n`` tasks from the queue's head, as many as it admits."""
        functions: list[Payload] = []
        index: dict[tuple[int, int], int] = {}  # a function (and its map's snapshot): its place
        keys: dict[int, tuple[str, int]] = {}  # id(fn) -> its key and allowance
        tasks: list[p.Task] = []
        items: list[WorkItem] = []
        batched = 0  # bytes the tasks so far put in the message
        queue, estimates = self.queue, self.estimates
        inline = self._owner_ident is not None  # sent by a submitting or waiting thread
        while len(items) < n and queue:
            item = queue[0]
            fn_id = id(item.fn)
            known = keys.get(fn_id)
            if known is None:
                name = function_key(item.fn)
                known = keys[fn_id] = (name, self._allowance(name))
            key = known[0]
            estimate = estimates.get(key)
            if not conn.admits(estimate, known[1]):
                break
            queue.popleft()
            # Running means started, or next to start: a task sent to wait behind another
            # stays pending (and cancellable) until the one before it has finished.
            if not (self._hold(conn, item) if conn.inflight else item.start()):
                item.start()  # cancelled while queued: its waiters are told (once)
                continue
            try:
                place = _function_place(functions, index, item)
                args = self._pickle_arguments(item, key)
                size = p.check_fits(args, conn.shm, "the arguments and their buffers")
            except BaseException as exc:  # an argument's ``__reduce__`` may raise anything
                # (KeyboardInterrupt, SystemExit: signals are held while a caller's thread
                # dispatches): it fails this task, saying so, and no other future waits on
                # a dead shard
                self._fail_unpicklable(item, exc)
                continue
            item.key = key
            conn.hold(item, estimate)
            if inline and isinstance(item.future, TaskFuture):  # its waiter may read here
                _future.sent(item.future, self, conn)
            tasks.append(p.Task(item.task_id, place, args))
            items.append(item)
            batched += size
            if batched >= p.BATCH_ROOM:  # so one more task of any size fits beside these
                break
        if tasks:
            if len(conn.inflight) == len(tasks):  # it held nothing: the first starts now
                conn.head_since = self.clock()
                conn.timed = (tasks[0].task_id, conn.head_since)
            if len(conn.inflight) > 1:
                self.holders[conn.worker_id] = conn
                self._revoke_at = min(self._revoke_at, self._overstays_at(conn))
            self.idle.pop(conn.worker_id, None)
            self._send_frame(conn, p.Tasks(functions, tasks, conn.holds_alone()), items)

    def _pickle_arguments(self, item: WorkItem, key: str) -> Payload:
        """``item``'s arguments, pickled once: straight by value where the last arguments
        of its function carried the script's objects (the plain pickler would meet them,
        and everything would be pickled twice); numbers and short text at once."""
        plain = dumps_scalars(item.args, item.kwargs)
        if plain is not None:
            return plain
        positional, marks = kept_functions(item.args, item.snapshot)  # (a chunk's function)
        by_value = key in self.by_value_args or script_objects(positional, item.kwargs)
        args = dumps((positional, item.kwargs), what="arguments", functions_as_bytes=True,
                     by_value=by_value, main_marks=marks)
        if by_value_needed(args, marks) != by_value:
            self.by_value_args.symmetric_difference_update((key,))
        return args

    def _hold(self, conn: Conn, item: WorkItem) -> bool:
        """``item`` goes to wait at ``conn`` behind its task: it stays pending, cancellable
        through `ask_back`. False if it was cancelled."""
        future = item.future
        if item.started or not isinstance(future, TaskFuture):
            return item.start()  # a plain future cannot ask: it counts as running from here
        return future.hold(self, conn)

    # ------------------------------------------------------------ cancelling what a worker holds

    def ask_back(self, key: object, future: TaskFuture[Any], *, wait: bool = True) -> bool:
        """`TaskFuture.cancel` of a task a worker holds (any thread): ask the worker for it
        back and cancel it. False if it had started, or no answer came in `CANCEL_WAIT`;
        without ``wait``, False at once (the answer, when it comes, cancels it or not)."""
        if wait and self.on_its_thread():
            return False  # a done-callback on the thread that would answer: it cannot wait
        answer = Answer()
        self.post(ev.Call(partial(self._ask_back, future, answer)))
        return answer.wait(CANCEL_WAIT) if wait else False

    def _ask_back(self, future: TaskFuture[Any], answer: Answer) -> None:
        held = future.holding  # read here: only this thread holds and releases
        if held is None:  # back in the queue (then it is cancelled), or it ran meanwhile
            answer.cancel(future)
            return
        holder, key = held
        conn = cast("Conn", key)
        task_id = next((t for t, item in conn.inflight.items() if item.future is future), None)
        if holder is not self or task_id is None:
            answer.give(False)
            return
        item = conn.inflight[task_id]
        if conn.claims is not None:  # the board answers at once, busy worker or not
            numbers = conn.claims.take_back((item.number,))
            if numbers:
                del conn.inflight[task_id]
                self._requeue(conn, [item], {task_id: answer})
                return
            if numbers is not None:  # it had started there
                answer.give(False)
                item.start()
                return
        self._revoke(conn, [task_id], {task_id: answer})

    def _revoke(self, conn: Conn, task_ids: list[int], answers: dict[int, Answer],
                *, overstay: bool = False) -> None:
        """Ask ``conn`` for tasks it has not started; its answers come in the same order."""
        conn.revokes.append((answers, overstay))
        self._send(conn, p.Revoke(task_ids))

    def _unasked(self, conn: Conn) -> None:
        """``conn`` will not answer (lost, or the end): each cancel still waiting gets False."""
        for answers, _ in conn.revokes:
            for answer in answers.values():
                answer.give(False)
        conn.revokes.clear()

    def _fail_unpicklable(self, item: WorkItem, exc: BaseException) -> None:
        if not isinstance(exc, SerializationError):
            wrapped = PicklingError(f"cannot pickle the arguments: "
                                    f"{type(exc).__name__} raised while pickling")
            wrapped.__cause__ = exc
            exc = wrapped
        item.future.set_exception(name_task(exc, item))
        self._count(item, False)
        self._record_failure(item, None)

    def _send_frame(self, conn: Conn, message: p.Tasks, items: list[WorkItem]) -> None:
        policy = p.ShmPolicy(self.session.executor_id) if conn.shm else None
        frame = p.encode(message, policy, conn.cache)
        if policy is not None and policy.created:
            for item in items:
                item.shm_names = policy.created
        self._send(conn, frame)

    def _send(self, conn: Conn, message: p.Message | bytes) -> None:
        frame = message if isinstance(message, bytes) else p.encode(message)
        try:
            conn.channel.send_nowait(frame)
        except ProtocolError:
            self._lose_after_reading(conn)
            return
        conn.last_sent = self.clock()
        self.bytes_sent += len(frame)

    # ------------------------------------------------------------ housekeeping

    def _housekeep(self) -> None:
        now = self.clock()
        beat = self.config.heartbeat
        judge = self._may_judge_silence(now)
        self.losses.flush(now)
        self._next_housekeeping = now + beat / 4
        if self.exit_deadline is not None:
            self._check_exit(now)
        silence = self.config.silence_timeout
        keepalive = p.keepalive(beat, silence)  # (what a worker checks is silence)
        for conn in list(self.conns.values()):
            if conn.state is State.READY:
                if judge and now - conn.last_recv > silence and not self._busy(conn, now):
                    self._lose(conn, f"worker {conn.worker_id} stopped responding "
                                     f"(nothing heard for {now - conn.last_recv:.1f}s)")
                    continue
                if now - conn.last_sent >= keepalive:
                    self._send(conn, p.Heartbeat())
                self._maybe_retire(conn, now)
            elif conn.state is State.AWAIT_HELLO:
                if now - conn.created > self.config.start_timeout:
                    self._forget(conn, lost=True)
                    self.lifecycle.worker_failed_to_start(conn.worker_id, None)
            elif conn.state is State.DISCONNECTED and now >= conn.deadline:
                self._finalize(conn)

    def _busy(self, conn: Conn, now: float) -> bool:
        """Whether ``conn``'s silent worker used CPU within the last ``silence_timeout``,
        where its link can tell (a local socket): its task holds the GIL in C (no thread of
        it can send), so it is at work, not hung; a starved one may get a tick only now and
        then. A hung or stopped worker uses none, and is lost a silence later."""
        cpu = conn.channel.peer_cpu()
        if cpu is None:
            return False
        if conn.silent_cpu is None or cpu != conn.silent_cpu[0]:
            conn.silent_cpu = (cpu, now)  # (a first look counts as use: look again)
            return True
        return now - conn.silent_cpu[1] < self.config.silence_timeout

    def _may_judge_silence(self, now: float) -> bool:
        """False for a while after this thread itself was held up (the process stopped, the
        machine starved): what workers sent meanwhile may not have been read yet."""
        late = now - self._next_housekeeping
        if self._next_housekeeping and late > max(1.0, self.config.heartbeat):
            self._judge_after = now + 2 * self.config.heartbeat
        return now >= self._judge_after

    def _check_exit(self, now: float) -> None:
        """At interpreter exit, stop waiting for workers that never connected."""
        assert self.exit_deadline is not None
        self._next_housekeeping = min(self._next_housekeeping, self.exit_deadline)
        if now < self.exit_deadline or self.lifecycle.ready_count() or not self.backlog:
            return
        self.lifecycle.break_executor(
            f"the interpreter is exiting and no worker connected within {EXIT_START_GRACE:g}s "
            f"of it; {self.backlog} task(s) could not run", None,
        )

    def _maybe_retire(self, conn: Conn, now: float) -> None:
        idle = self.config.idle_timeout
        if (idle is None or conn.inflight or self._tasks_wait()
                or now - conn.idle_since < idle):
            return
        if self.lifecycle.may_retire(conn.worker_id):
            log.debug("worker %s retires: idle for %ss", conn.worker_id, idle)
            self._stop_serving(conn, f"idle for {idle}s")
            self._send(conn, p.Bye("idle"))

    def _tasks_wait(self) -> bool:
        """Tasks wait for a worker here (queued, or just submitted)."""
        return bool(self.queue or self.incoming)

    def _stop_serving(self, conn: Conn, leaving: str | None) -> None:
        """The worker gets no more tasks: it leaves once what it holds is done."""
        conn.state = State.RETIRING
        if leaving is not None:
            conn.leaving = leaving
        self.hungry.pop(conn.worker_id, None)
        self.idle.pop(conn.worker_id, None)

    def _hang_up(self, conn: Conn) -> None:
        """The worker said its last word (`Bye`, `InitFailed`): close its link, which tells it
        that everything it sent has arrived (a process that exits with frames still queued in
        its link may lose them), and wait for its exit status. Tasks it held and will not run
        go back to the queue, uncharged."""
        items = list(conn.inflight.values())
        conn.inflight.clear()
        for item in items:
            item.requeued()
        self._unasked(conn)
        self.queue.extendleft(reversed(items))
        self._unregister(conn)
        conn.state = State.DISCONNECTED
        conn.deadline = self.clock() + STATUS_WAIT

    # ------------------------------------------------------------ losing workers

    def _lose_after_reading(self, conn: Conn) -> None:
        """A send found the worker gone, or not reading. What it sent before comes first:
        the results of tasks it finished, and the `Bye` of a worker that left this executor
        for its silence (stalled: a main thread in C, a stopped process), which retires it
        and puts back, uncharged, what it held. Only then is it lost, if it still counts."""
        self._take_in(conn)
        if conn.state is not State.READY or self.conns.get(conn.worker_id) is not conn:
            return
        self._lose(conn, None if conn.channel.peer_gone else
                   f"worker {conn.worker_id} stopped reading its messages")

    def _take_in(self, conn: Conn) -> None:
        """Read what the worker sent, whatever the selector has said so far."""
        conn.channel.take_in()
        self._receive(conn)

    def _lose(self, conn: Conn, why: str | None) -> None:
        """The worker is gone: requeue what it held; the task it was running is charged."""
        items = list(conn.inflight.values())
        conn.inflight.clear()
        for item in items:
            item.requeued()
        self._unasked(conn)
        self._unregister(conn)
        # A worker lost in its initializer ran none of them: they go back uncharged (and
        # the executor breaks: see _finalize).
        ran = items if not conn.initializing else []
        conn.charged = ran[0] if ran else None
        if ran:
            ran[0].losses += 1
        doomed = [i for i in ran[:1] if i.losses > self.config.max_task_retries]
        for item in reversed(items[len(doomed):]):
            self.queue.appendleft(item)
            self.retried += bool(ran)
        self.lost += 1
        conn.lost = True
        conn.doomed, conn.why = doomed, why
        conn.state = State.DISCONNECTED
        conn.deadline = self.clock() + STATUS_WAIT
        if conn.status is not None or why is not None:  # else the log waits for it, a little
            self._finalize(conn)

    def _finalize(self, conn: Conn) -> None:
        """Say how the worker ended (to the task it ran, in the log); fail the task that
        exhausted its retries; replace the worker."""
        why = conn.why or conn.describe_exit()
        if conn.initializing and conn.lost and self.broken is None:
            # Its initializer ended the process: every worker's would (the stdlib's pool
            # breaks too), so no task is charged or retried on a replacement.
            conn.initializing = False
            self.lifecycle.break_executor(
                f"A worker ended while running the initializer ({phrase_of(why, conn.worker_id)}"
                "), the executor is not usable anymore", None)
        charged, retries = conn.charged, self.config.max_task_retries
        if charged is not None:
            charged.causes += (Loss(conn.worker_id, phrase_of(why, conn.worker_id),
                                    conn.status),)
        for item in conn.doomed:
            for name in item.shm_names:
                _shm.discard(name)
            error = WorkerLostError(lost_message(item, retries))
            error.__cause__ = remote_traceback(f'\n"""\n{_abrupt_end(conn)}\n"""')
            item.future.set_exception(error)
            self._count(item, False)
            conn.tasks_failed += item.items
            self._record_failure(item, conn.worker_id)
            # in the task stream and the durations as a failure, from when it started
            # there (about), as a task that raised is
            now = self.clock()
            start = min(conn.head_since, now)
            self.spans.append((item.task_id, conn.worker_id, span_function(item), start, now,
                               False))
            self.duration_counts[bisect_left(DURATION_BOUNDS, now - start)] += 1
            self.duration_total += now - start
        failed, conn.doomed, conn.charged = bool(conn.doomed), [], None
        self._forget(conn)
        orderly = conn.leaving is not None and conn.why is None
        # Once shut down, only queued work wants a new worker (a replacement would run the
        # initializer, which a shutdown waits for: replacing for `min_workers` never ends).
        replace = not self.shutting_down or bool(self.queue or self.incoming)
        self.lifecycle.worker_gone(conn.worker_id, conn.handle, replace=replace,
                                   lost=not orderly, waiting=self._tasks_wait)
        if orderly:  # logged once the worker table says so too
            log.info("worker %s left: %s", conn.worker_id, conn.leaving)
        else:
            self.losses.lost(loss_line(why, charged, retries, failed=failed), self.clock())

    def _forget(self, conn: Conn | None, *, lost: bool = False) -> None:
        if conn is None:
            return
        conn.lost = conn.lost or lost
        self._unregister(conn)
        conn.state = State.GONE
        self.conns.pop(conn.worker_id, None)
        _observe.note_gone(self.gone, conn, self.clock())

    def _unregister(self, conn: Conn, *, hang_up: bool = True) -> None:
        if conn.claims is not None:
            conn.claims.close()
            conn.claims = None
        self.hungry.pop(conn.worker_id, None)
        self.idle.pop(conn.worker_id, None)
        self.holders.pop(conn.worker_id, None)
        if conn.stack_requests:
            _observe.fail_stack_requests(
                conn.stack_requests, f"worker {conn.worker_id} left before it answered")
        if conn.counted:
            conn.counted = False
            self.ready_workers -= 1
        if not conn.channel.closed:
            if conn.collected:  # a waiting thread reads it, unregistered: it leaves it so
                conn.collected = False
            else:
                self.selector.unregister(conn.channel.fileno())
            if hang_up:
                conn.channel.close()

    # ------------------------------------------------------------ the end

    def _fail_everything(self, error: BaseException) -> None:
        items = list(self.queue) + list(self.incoming)
        for conn in self.conns.values():
            self._unasked(conn)
            items.extend(conn.inflight.values())
            items.extend(conn.doomed)
            conn.inflight.clear()
            conn.doomed = []
        self.queue.clear()
        self.incoming.clear()
        for item in items:
            if item.future.cancelled():
                item.start()  # tells its waiters
                continue
            if item.future.done():
                continue
            try:
                item.future.set_exception(error)
            except Exception:
                continue
            self._count(item, False)

    def close(self) -> None:
        """Say goodbye to connected workers and close every channel (the loop's last act)."""
        for conn in [c for c in self.conns.values() if c.state is State.DISCONNECTED]:
            self._finalize(conn)  # its exit status did not come in time: log it as it is
        for conn in list(self.conns.values()):
            if conn.state is State.READY:
                conn.leaving = conn.leaving or "the executor shut down"
                self._send(conn, p.Bye("shutdown"))
        for conn in list(self.conns.values()):
            self._unasked(conn)
            # A worker still starting or authenticating keeps its endpoint open until the
            # pool has stopped it (`left_open`), so it never sees a hang-up it would report
            # as a fault.
            starting = conn.state in _NOT_YET_CONNECTED
            self._unregister(conn, hang_up=not starting)
            if starting and not conn.channel.closed:
                self.left_open[conn.worker_id] = conn.channel
            conn.state = State.GONE
            _observe.note_gone(self.gone, conn, self.clock())
        self.losses.flush(float("inf"))
        self.selector.close()


_NOT_YET_CONNECTED = (State.AWAIT_HELLO,)


def _unserved(conns: dict[str, Conn], served: set[str], n: int) -> list[tuple[str, Conn]]:
    """The first ``n`` of ``conns`` not in ``served``, as a list: serving them changes
    ``conns``."""
    return list(islice(((w, c) for w, c in conns.items() if w not in served), n))


def _abrupt_end(conn: Conn) -> str:
    """How the worker ended, in the words of the standard library's `BrokenProcessPool`."""
    status = conn.status
    if status is None or status.exit_code is None:
        return f"worker {conn.worker_id} terminated abruptly ({conn.why or 'connection lost'})"
    reason = f" ({status.reason})" if status.reason else ""
    report = f"; the interpreter reported:\n\n{conn.fault}" if conn.fault else ""
    return (f"worker {conn.worker_id} terminated abruptly with exit code "
            f"{status.exit_code}{reason}{report}")


def _function_place(functions: list[Payload], index: dict[tuple[int, int], int],
                    item: WorkItem) -> int:
    """Where ``item``'s function is among a message's ``functions``: pickled once a message,
    and once a map (its snapshot: a task submitted alone reads the globals as they are)."""
    pickled = (id(item.fn), id(item.snapshot))
    place = index.get(pickled)
    if place is None:
        functions.append(dumps_function(item.fn, item.snapshot))
        place = index[pickled] = len(functions) - 1
    return place

