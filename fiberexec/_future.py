"""A task's future: pending while it waits at a worker, and cancelled only if it never runs.

A worker is sent known short tasks ahead, to wait behind the one it runs (so that it never
idles for a round trip). Such a task has not started: its future stays pending, as a task
still queued in the executor does. It can start at any moment, though, once the task before
it ends. So `TaskFuture.cancel` asks: the shard holding it asks its worker for it back
(``Revoke``), and the call returns True only if the worker gave it back unstarted. A
cancelled call never runs, as with the standard library, whose call queue holds only tasks
already marked running.

A `TaskFuture` is also lighter than a plain `Future`: its condition is its own lock and
keeps no empty queue (`_Condition`), and it has no list of done-callbacks until one is
added, so a future holds three objects the garbage collector tracks, not eleven. A
program that keeps a hundred thousand futures pays for each of them at every full
collection (in a flood of no-op tasks, collections took a fifth of the executor's time).

The question takes one round trip to the worker (answered while it runs a task, once that
task has run a few milliseconds: see `fiberexec.worker.Watcher`), at most `CANCEL_WAIT`;
without an answer by then, or when asked from the shard's own thread (a done-callback
cancelling another future), `cancel` returns False and the task runs, as a running one
would.

A task sent by a thread standing in for the shard's (a submit while the shard's thread
sleeps) leaves its future a `Sent` list of waiters, which knows where the task went: a
thread that then waits for the future reads the worker's answer itself (`Collector`),
whether it waits in `result`, in `exception`, or in `concurrent.futures.wait` or
`as_completed` (their waiter, installed in that list, gets an event that reads first).
"""

from __future__ import annotations

import threading
import time
from _thread import RLock
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,
    RUNNING,
    InvalidStateError,
)
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
_SETTLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))

CANCEL_WAIT = 2.0  # seconds `cancel` waits for the worker holding a task to answer
# Seconds a thread waiting for a task's result reads its worker's link itself (the shard's
# thread meanwhile cannot act: see `fiberexec._shard.Shard.collect`); then it waits as usual.
COLLECT_MAX = 0.005

# Futures settled on a thread that only stood in for the shard's (see `deferring`), whose
# done-callbacks are the shard's thread's to run
_DEFERRED = threading.local()

# Set once Ctrl-C (a KeyboardInterrupt) cut a wait for a task short: a terminal's Ctrl-C
# reaches the standard library's workers too, and ends their tasks; here the program's exit
# interrupts those still running rather than waiting for them (`_executor._python_exit`).
INTERRUPTED = threading.Event()


class Holder(Protocol):
    def ask_back(self, key: object, future: TaskFuture[Any], *, wait: bool = True) -> bool:
        """Get the task back from its worker and cancel it; True if that was done. Without
        ``wait``: ask, and return False at once (it is cancelled if the worker gives it
        back)."""


class Collector(Protocol):
    def collect(self, keys: Sequence[object], done: Callable[[], bool], timeout: float) -> None:
        """On a thread about to wait: read the answers of the workers ``keys`` name here,
        until ``done()`` or at most ``timeout`` seconds, and take them in; return at once
        where that cannot be done (the answers then come the usual way, through the shard's
        thread)."""


class Sent(list[Any]):  # (the stdlib's ``_waiters``: a list of waiters)
    """A future's waiters (`Future._waiters`) once a thread standing in for the shard's
    thread sent its task (see `sent`), and where it went: for a thread that will wait for
    the future to read the worker's answer itself, through `TaskFuture.result` or
    `exception`, or `concurrent.futures.wait` and `as_completed`, which install a waiter
    here (`append`). It holds no reference to its future (no cycle keeps a future from being
    freed at once), and the shard lets go of it when the answer came (``collector`` None)."""

    __slots__ = ("collector", "key")

    def __init__(self, collector: Collector, key: object, waiters: list[Any]) -> None:
        super().__init__(waiters)
        self.collector: Collector | None = collector
        self.key = key

    def append(self, waiter: Any) -> None:
        """`concurrent.futures.wait` and `as_completed` install their waiter (under every
        future's lock, before anything can set its event): its event becomes one that reads
        the answers of the futures sent so, when the waiting thread waits on it."""
        super().append(waiter)
        if self.collector is not None:
            event = waiter.event
            if type(event) is not _CollectingEvent:
                event = waiter.event = _CollectingEvent()
            event.sources.append(self)


class _CollectingEvent(threading.Event):
    """A waiter's event whose `wait` first reads the answers its futures wait for (`Sent`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[Sent] = []

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set():
            first: Collector | None = None
            keys = []
            for sent in self.sources:  # those of the first shard among them
                collector = sent.collector
                if collector is not None and (first is None or collector is first):
                    first = collector
                    keys.append(sent.key)
            if first is not None:
                timeout = _collect(first, keys, self.is_set, timeout)
        return super().wait(timeout)


def sent(future: Future[Any], collector: Collector, key: object) -> None:
    """``future``'s task was sent to the worker ``key`` names by a thread standing in for
    the shard's (``collector``): a thread that waits for it may read the answer itself."""
    with future._condition:  # a waiter is installed under it
        waiters = future._waiters
        if type(waiters) is Sent:
            waiters.collector, waiters.key = collector, key
        else:
            future._waiters = Sent(collector, key, waiters)


def answered(future: Future[Any]) -> None:
    """``future``'s answer came: nothing is to be read for it (and it keeps no shard alive)."""
    waiters = future._waiters
    if type(waiters) is Sent:
        waiters.collector = None


def _collect(collector: Collector, keys: Sequence[object], done: Callable[[], bool],
             timeout: float | None) -> float | None:
    """`Collector.collect` for at most `COLLECT_MAX` of ``timeout``; what is left of it."""
    if timeout is None:
        collector.collect(keys, done, COLLECT_MAX)
        return None
    if timeout <= 0:
        return timeout
    start = time.monotonic()
    collector.collect(keys, done, min(timeout, COLLECT_MAX))
    return max(0.0, timeout - (time.monotonic() - start))


class _Condition(RLock):  # type: ignore[misc]  # (final in typeshed, not at run time)
    """A condition that is its own lock: an `RLock` (the C type, so ``with`` costs no Python
    call) with `threading.Condition`'s ``wait`` and ``notify``, which need of a lock only
    ``_is_owned``, ``_release_save`` and ``_acquire_restore``, the `RLock`'s own. One object
    the collector tracks where a `threading.Condition` and its lock are two (and five bound
    methods of the lock), and no queue of waiters until one waits."""

    _waiters: Any = ()  # a deque once a thread waits: most futures never see one

    def wait(self, timeout: float | None = None) -> bool:
        if not self._waiters:  # (held by the caller: `Condition.wait` checks that)
            self._waiters = deque()
        return threading.Condition.wait(self, timeout)  # type: ignore[arg-type]

    notify = threading.Condition.notify
    notify_all = threading.Condition.notify_all
    wait_for = threading.Condition.wait_for

    def _at_fork_reinit(self) -> None:
        super()._at_fork_reinit()  # type: ignore[misc]
        self._waiters = ()


class TaskFuture(Future[T]):
    """The future `FiberExecutor.submit` returns."""

    _holder: Holder | None  # who holds it at a worker...
    _hold_key: object  # ...and its key there

    def __init__(self) -> None:
        # `Future.__init__`'s attributes, with the lighter condition (a test keeps the two
        # attribute sets equal)
        self._condition = _Condition()  # type: ignore[assignment]  # (a Condition in all but name)
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        # a list once a callback is added (`add_done_callback`): most futures never get one
        self._done_callbacks: list[Callable[[Future[T]], object]] | tuple[()] = ()
        self._holder = self._hold_key = None  # here, not first set later: a shared-keys dict

    def __repr__(self) -> str:  # as the stdlib's futures show (its log lines name it too)
        return "<Future" + super().__repr__().removeprefix("<" + type(self).__name__)

    def _invoke_callbacks(self) -> None:
        if not self._done_callbacks:
            return
        deferred: list[TaskFuture[Any]] | None = getattr(_DEFERRED, "futures", None)
        if deferred is not None and any(type(fn) is not Prompt for fn in self._done_callbacks):
            deferred.append(self)
            return
        super()._invoke_callbacks()  # type: ignore[misc]

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                if not self._done_callbacks:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)
                return
        super().add_done_callback(fn)  # done: the stdlib's calls it now, as it would

    def result(self, timeout: float | None = None) -> T:
        try:
            if type(self._waiters) is Sent:
                timeout = self._collect(timeout)
            return super().result(timeout)
        except KeyboardInterrupt as exc:
            if exc is not self._exception:  # (not the task's own)
                INTERRUPTED.set()
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            if type(self._waiters) is Sent:
                timeout = self._collect(timeout)
            return super().exception(timeout)
        except KeyboardInterrupt:
            INTERRUPTED.set()
            raise

    def collect(self, timeout: float | None) -> float | None:
        """Before waiting for something its outcome brings about (a pool's `AsyncResult`,
        told by a `Prompt` callback): read the answer on this thread, as `result` does;
        what is left of ``timeout``."""
        return self._collect(timeout) if type(self._waiters) is Sent else timeout

    def _collect(self, timeout: float | None) -> float | None:
        """Read the answer on this thread if it can be done (once); what is left of
        ``timeout``."""
        sent: Sent = self._waiters  # type: ignore[assignment]
        collector, sent.collector = sent.collector, None
        if collector is None:
            return timeout
        return _collect(collector, (sent.key,), self.done, timeout)

    def cancel(self) -> bool:
        with self._condition:
            holder = self._holder
            if holder is None or self.done():  # (a held task failed with its executor)
                return super().cancel()
            key = self._hold_key
        return holder.ask_back(key, self)

    def cancel_soon(self) -> None:
        """`cancel`, without waiting for a worker holding the task to answer: the task is
        cancelled if the worker gives it back unstarted (what ``map`` does with the tasks
        it will not return, after a timeout or an error, as the stdlib's cancels them: at
        once)."""
        with self._condition:
            holder = self._holder
            key = self._hold_key
        if holder is None:
            self.cancel()
        else:
            holder.ask_back(key, self, wait=False)

    def set_result(self, result: T) -> None:
        """The stdlib's, less its two Python calls to wake nobody: the shard settles every
        task's future here, and most have no thread waiting on their condition."""
        with self._condition:
            if self._state in _SETTLED:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            if self._condition._waiters:  # type: ignore[attr-defined]  # (`_Condition`'s)
                self._condition.notify_all()
        self._invoke_callbacks()

    def set_running_or_notify_cancel(self) -> bool:
        with self._condition:
            self._holder = None  # it runs (or was cancelled): nothing to ask for any more
            if self._state == PENDING:  # the usual case, under one lock instead of two
                self._state = RUNNING
                return True
            return super().set_running_or_notify_cancel()  # the stdlib's answer otherwise

    # ------------------------------------------------------------ for the shard

    def hold(self, holder: Holder, key: object) -> bool:
        """It is sent to wait at a worker; False if it was cancelled meanwhile."""
        with self._condition:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):  # held: no second lock
                return False
            self._holder, self._hold_key = holder, key
            return True

    def release(self) -> None:
        """It is back in the executor's queue (given back, or its worker was lost)."""
        with self._condition:
            self._holder = None

    @property
    def holding(self) -> tuple[Holder, object] | None:
        """Who holds it at a worker, and its key there (None: nobody)."""
        holder = self._holder
        return None if holder is None else (holder, self._hold_key)

    def cancel_unheld(self) -> bool:
        """Cancel it as the standard library would, now that no worker holds it."""
        with self._condition:
            self._holder = None
            return super().cancel()


class Prompt:
    """A done-callback that runs none of the user's code and returns at once (a pool's
    result taking in its task's outcome): a thread standing in for the shard's runs it
    itself, where it defers the others (see `deferring`)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Future[Any]], None]) -> None:
        self.fn = fn

    def __call__(self, future: Future[Any]) -> None:
        self.fn(future)


def deferring() -> None:
    """On a thread that stands in for a shard's (a caller reading its own answer): the
    done-callbacks of futures settled here wait for `deferred`, which the shard's thread
    runs, as the standard library runs them all on its own thread. A callback run inside
    ``result()`` would deadlock a program whose callback takes a lock its waiter holds."""
    _DEFERRED.futures = []


def deferred() -> Callable[[], None] | None:
    """End `deferring`: what runs the callbacks held back meanwhile (None: there are none)."""
    futures: list[TaskFuture[Any]] = _DEFERRED.futures
    _DEFERRED.futures = None
    if not futures:
        return None

    def run() -> None:
        for future in futures:
            future._invoke_callbacks()

    return run


class Answer:
    """One `cancel` call waiting for the shard's answer; the shard acts only while the
    caller still waits (a late answer leaves the task to run, as `cancel` then said)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._waiting = True
        self._ok = False

    def wait(self, timeout: float) -> bool:
        self._done.wait(timeout)
        with self._lock:
            self._waiting = False
            return self._ok

    def give(self, ok: bool) -> None:
        with self._lock:
            self._ok = ok and self._waiting
            self._done.set()

    def cancel(self, future: TaskFuture[Any]) -> bool:
        """Cancel ``future`` if the caller still waits; True if it did."""
        with self._lock:
            if self._waiting:
                self._ok = future.cancel_unheld()
            self._done.set()
            return self._ok
