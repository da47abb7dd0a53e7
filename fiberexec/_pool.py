"""The task pool: shards that schedule, a supervisor that keeps their workers, and shutdown.

    FiberExecutor.submit -> TaskPool.submit -> a shard's incoming queue (round robin)
                                             -> WorkerSupervisor.scale_up
    shutdown: Shutdown event to every shard -> (a thread) join the shards -> stop workers

The pool builds the `Session` every shard shares, the shards, and the `WorkerSupervisor` they
report to; after that it only routes tasks, counts them and shuts everything down.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from fiberexec import _auth, _fdlimit, _interrupts, _observe, _shm
from fiberexec import _events as ev
from fiberexec._backend import Backend
from fiberexec._config import ExecutorConfig
from fiberexec._conn import State
from fiberexec._control import ControlServer
from fiberexec._errors import BrokenFiberExecutor
from fiberexec._output import OutputSink
from fiberexec._protocol import OutputMode
from fiberexec._serialize import dumps_for_workers
from fiberexec._session import Session
from fiberexec._shard import Shard
from fiberexec._stats import Stats
from fiberexec._supervisor import WorkerSupervisor
from fiberexec._task import WorkItem

log = logging.getLogger("fiberexec")
PROGRESS_INTERVAL = 0.1
THROUGHPUT_WINDOW = 10.0  # seconds over which `fiberexec top` reports tasks per second


def _output_mode(output: str | None, backend: Backend) -> OutputMode:
    """What workers do with their tasks' output: by default, forward it where it would
    otherwise be lost (workers on other hosts, in containers, pods or jobs)."""
    if output is None:
        output = "inherit" if backend.workers_share_host else "forward"
    modes = {"inherit": OutputMode.INHERIT, "off": OutputMode.DISCARD,
             "forward": OutputMode.FORWARD}
    return modes.get(output, OutputMode.FILES)  # else a directory


class TaskPool:
    def __init__(
        self,
        config: ExecutorConfig,
        backend: Backend,
        executor_id: str,
        *,
        owns_backend: bool,
        progress: Callable[[Stats], None] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.owns_backend = owns_backend
        self.progress = progress
        self.terminate_at_exit = False  # a `multiprocessing.Pool`'s: stopped, not awaited
        initializer = None
        if config.initializer is not None:
            initializer = dumps_for_workers((config.initializer, config.initargs),
                                            what="initializer and its initargs")
        self.session = Session(
            config=config,
            executor_id=executor_id,
            secret=_auth.new_secret(),
            initializer=initializer,
            shm=_shm.available(),
            output=_output_mode(config.output, backend),
        )
        self.sink = None
        if self.session.output in (OutputMode.FORWARD, OutputMode.FILES):
            self.sink = OutputSink(config.output if config.output != "forward" else None)
        self.supervisor = WorkerSupervisor(
            self.session, backend, outstanding=self._outstanding, progress=self.report_progress,
            sink=self.sink,
        )
        self.shards = [Shard(self.session, i, self.supervisor) for i in range(config.shards)]
        for shard in self.shards:
            shard.peers = self.shards
        self.supervisor.shards = self.shards
        self._lock = threading.Lock()
        self._started = False
        self._next_shard = itertools.count()
        self._submitted = 0
        self._items_submitted = 0  # map items, as stats() counts what finished
        self._closing = False  # shutdown() was called: no new tasks
        self._closed = threading.Event()  # everything is stopped and cleaned up
        self._t0 = 0.0
        self._last_progress = 0.0
        self.control: ControlServer | None = None  # with observe=True, once started
        self._on_close: list[Callable[[], None]] = []
        self._pid = os.getpid()  # a fork of this process (a stdlib child) has none of it

    @property
    def executor_id(self) -> str:
        return self.session.executor_id

    @property
    def secret(self) -> bytes:
        return self.session.secret

    @property
    def broken(self) -> BrokenFiberExecutor | None:
        return self.supervisor.broken

    # ------------------------------------------------------------ submitting

    def submit(self, item: WorkItem) -> None:
        self.start()
        self._submitted += 1
        self._items_submitted += item.items
        self.shards[next(self._next_shard) % len(self.shards)].put(item)
        if self.supervisor.wants_more():
            self.supervisor.scale_up()

    def submit_all(self, items: list[WorkItem]) -> None:
        """`submit` each, each shard handed its share at once (see `Shard.put_all`)."""
        if not items:
            return
        self.start()
        self._submitted += len(items)
        self._items_submitted += sum(item.items for item in items)
        shares: dict[int, list[WorkItem]] = {}
        for item in items:
            shares.setdefault(next(self._next_shard) % len(self.shards), []).append(item)
        for index, share in shares.items():
            self.shards[index].put_all(share)
        if self.supervisor.wants_more():
            self.supervisor.scale_up()

    def start(self) -> None:
        """Start the shards and the first workers (at the first submit, or when asked)."""
        if self._started:
            return
        held = _interrupts.hold()  # a Ctrl-C now would leave it started with no shard running
        try:
            self._started = True
            _fdlimit.ensure(self.config.max_workers)
            self._t0 = time.monotonic()
            log.info("executor %s starts: backend %s, up to %d workers", self.executor_id,
                     self.backend.name, self.config.max_workers)
            for shard in self.shards:
                shard.thread.start()
            self.supervisor.launch_many(self.config.min_workers)
        finally:
            _interrupts.release(held)
        if self.config.observe:
            self.control = ControlServer(self.executor_id, self.backend.name, self.observed)
            try:
                self.control.start()
            except OSError as exc:  # no reason to refuse tasks: say so and go on unobserved
                log.warning("observe=True: could not serve fiberexec top (%s)", exc)
                self.control.close()
                self.control = None

    def _outstanding(self) -> int:
        finished = sum(s.done + s.failed for s in self.shards)
        return self._submitted - finished

    def break_executor(
        self, message: str, cause: BaseException | None, *, level: int = logging.ERROR
    ) -> None:
        self.supervisor.break_executor(message, cause, level=level)

    def report_progress(self) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL or self._outstanding() == 0:
            self._last_progress = now
            self.progress(self.stats())

    # ------------------------------------------------------------ stopping

    def _inherited(self) -> bool:
        """Whether this is a forked child's copy: the pool's threads, workers and files are
        its parent's, which a child's exit (hooks, finalizers) must leave alone."""
        return os.getpid() != self._pid

    def interpreter_exiting(self) -> None:
        """The interpreter is exiting: tasks still run, but no worker is awaited for long."""
        if self._inherited():
            return
        for shard in self.shards:
            shard.post(ev.Exiting())

    def force_stop(self, message: str, *, grace: float) -> None:
        """Cancel what has not started, fail what runs, stop every worker (no waiting)."""
        if self._inherited():
            return
        self.supervisor.stop_grace = grace
        self.shutdown(wait=False, cancel_futures=True)
        self.break_executor(message, None, level=logging.INFO)

    def interrupt(self) -> None:
        """Cancel what has not started and interrupt what runs (`Shard.interrupt`)."""
        if self._inherited() or self._closed.is_set():  # (its shards' threads are gone)
            return
        for shard in self.shards:
            shard.post(ev.Call(shard.interrupt))

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once everything is stopped (from the shutdown thread)."""
        self._on_close.append(callback)

    def shutdown(self, *, wait: bool, cancel_futures: bool) -> None:
        if self._inherited():
            return
        # A Ctrl-C once closing is marked, before the thread that finishes it runs, would
        # leave every later shutdown (the one at exit too) waiting for an end none brings.
        held = _interrupts.hold()
        try:
            with self._lock:
                already = self._closing
                self._closing = True
            if not already:
                for shard in self.shards:
                    shard.post(ev.Shutdown(cancel_futures))
                threading.Thread(target=self._finish, name="fiberexec-shutdown",
                                 daemon=True).start()
        finally:
            _interrupts.release(held)
        if wait:
            if any(shard.on_its_thread() for shard in self.shards):
                # a done-callback: the shard's thread would wait for itself (as the stdlib's
                # manager thread, joining itself, raises)
                raise RuntimeError("cannot join current thread")
            self._closed.wait()

    def _finish(self) -> None:
        try:
            for shard in self.shards:
                if shard.thread.is_alive():
                    shard.thread.join()
                elif not self._started:
                    shard.close()  # never ran: its loop's last act is ours to do
            self.supervisor.stop_all({w: link for shard in self.shards
                                      for w, link in shard.left_open.items()})
            if self.sink is not None:
                self.sink.close()
            if self.owns_backend:
                self.backend.close()  # a backend's close also ends its starts in flight
            # A broken executor's starts in flight were abandoned: they clean up after
            # themselves, so its shutdown does not wait for a host that does not answer.
            self.supervisor.join(timeout=1.0 if self.supervisor.broken else 30.0)
            _shm.drop_pool(self.executor_id)
            _shm.remove_all(self.executor_id)
        finally:
            try:
                if self.control is not None:  # `fiberexec top` sees it to the end
                    self.control.close()
                for callback in self._on_close:
                    callback()
            finally:
                self._closed.set()

    # ------------------------------------------------------------ stats

    def stats(self) -> Stats:
        shards = self.shards
        done = sum(s.items_done for s in shards)  # map items, not the chunks carrying them
        failed = sum(s.items_failed for s in shards)
        elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        connected, total = self.supervisor.counts()
        # one still in its initializer is starting, as workers() shows it: it runs no task
        initializing = sum(c.initializing and c.state is State.READY
                           for s in shards for c in list(s.conns.values()))
        ready = max(0, connected - initializing)
        return Stats(
            workers=ready,
            workers_starting=max(0, total - ready),
            tasks_pending=sum(s.backlog for s in shards),
            tasks_running=sum(s.running for s in shards),
            tasks_done=done,
            tasks_failed=failed,
            tasks_retried=sum(s.retried for s in shards),
            tasks_stolen=sum(s.stolen for s in shards),
            workers_lost=sum(s.lost for s in shards),
            messages_rejected=sum(s.rejected for s in shards),
            throughput=(done + failed) / elapsed if elapsed > 0 else 0.0,
            args_kept_bytes=sum(s.arg_tally.kept for s in shards),
            args_saved_bytes=sum(s.arg_tally.saved for s in shards),
            bytes_sent=sum(s.bytes_sent for s in shards),
            bytes_received=sum(s.bytes_received for s in shards),
            tasks_submitted=self._items_submitted,
        )

    # ------------------------------------------------------------ observing

    def workers(self) -> list[_observe.WorkerInfo]:
        return _observe.worker_infos(self.shards, self.supervisor.known(), self.backend.name,
                                     self.executor_id)

    def task_spans(self, since: float, limit: int | None = None) -> list[_observe.TaskSpan]:
        return _observe.task_spans(self.shards, since, limit)

    def durations(self) -> _observe.Durations:
        return _observe.durations(self.shards)

    def failures(self, limit: int) -> list[_observe.FailureInfo]:
        return _observe.failures(self.shards, limit)

    def observed(self, since: float) -> dict[str, Any]:
        """What `fiberexec top` shows, as JSON-ready values (see `fiberexec._control`)."""
        # The rate over the last THROUGHPUT_WINDOW seconds, or since the first submit if
        # that is sooner (a young executor's rate is not diluted by time it did not live)
        window = min(THROUGHPUT_WINDOW, max(1e-3, time.monotonic() - (self._t0 or math.inf)))
        medians, recent = _observe.span_summary(self.shards, window)
        return {
            "executor_id": self.executor_id, "pid": os.getpid(), "time": time.time(),
            "backend": self.backend.name, "max_workers": self.config.max_workers,
            "stats": dataclasses.asdict(self.stats()), "throughput": recent,
            "window": window,
            "workers": [dataclasses.asdict(w) for w in self.workers()],
            "medians": medians,
            "spans": [dataclasses.asdict(s) for s in self.task_spans(since)] if since else [],
            "failures": [dataclasses.asdict(f) for f in self.failures(10)],
        }

    def dump_stack(self, worker_id: str, timeout: float) -> str:
        shard = next((s for s in self.shards if _observe.connected(s, worker_id)), None)
        if shard is None:
            raise LookupError(_observe.not_serving(worker_id, self.workers()))
        future = shard.request_stack(worker_id)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # a late answer is dropped
            raise TimeoutError(
                f"worker {worker_id} did not send its stack within timeout={timeout}s; it may "
                f"be stopped, or a task may hold the interpreter's lock in native code "
                f"(raise timeout= to wait longer)"
            ) from None
