"""`FiberExecutor`: the `concurrent.futures.Executor` contract over the sharded task pool."""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import multiprocessing.context
import numbers
import operator
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from fiberexec import _future, _imports, _interrupts, _observe
from fiberexec._backend import Backend
from fiberexec._chunks import map_chunk, starmap_chunk
from fiberexec._config import ARGUMENT, BY_KEY, NOT_SETTINGS, document, resolve
from fiberexec._errors import ConfigurationError
from fiberexec._functions import kept_functions
from fiberexec._future import TaskFuture
from fiberexec._observe import Durations, FailureInfo, TaskSpan, WorkerInfo
from fiberexec._pool import TaskPool
from fiberexec._registry import load_backend
from fiberexec._retry import RetryPolicy
from fiberexec._serialize import Snapshot, dumps_function
from fiberexec._stats import Stats
from fiberexec._task import WorkItem
from fiberexec._tls import TLSOptions

if TYPE_CHECKING:
    from fiberexec._dashboard import Dashboard, Source

T = TypeVar("T")
SUBMIT_AFTER = 0.002  # seconds a map reads its input before it hands over what it read
_live_pools: weakref.WeakSet[TaskPool] = weakref.WeakSet()
# Executors whose ``with`` block the main thread is in: one still here at exit was left by
# an exception that cut its ``__exit__`` short, a signal's (a second Ctrl-C). Held, not
# weakly: the program that caught that exception may have dropped the executor since.
_main_blocks: set[FiberExecutor] = set()
_global_shutdown = False


def _python_exit() -> None:
    """At interpreter exit, finish what was submitted, as the standard library's executor
    does; a `multiprocessing.Pool`'s executor is terminated, as the stdlib's pool is. A
    program that Ctrl-C ended (an uncaught ``KeyboardInterrupt``, one that cut a wait for a
    task short, or one that cut a ``with`` block's end short) waits for no task: see
    `FiberExecutor.__exit__`."""
    global _global_shutdown
    _global_shutdown = True
    pools = list(_live_pools)
    interrupted = (isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)
                   or _future.INTERRUPTED.is_set())
    cut_short = {id(ex._pool) for ex in list(_main_blocks)}
    for pool in pools:
        if interrupted or id(pool) in cut_short:
            pool.interrupt()
        if pool.terminate_at_exit:
            pool.break_executor("the interpreter exited before the pool was closed", None,
                                level=logging.INFO)
            pool.shutdown(wait=False, cancel_futures=True)
        else:
            pool.interpreter_exiting()
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=False)


threading._register_atexit(_python_exit)  # type: ignore[attr-defined]
# A fork of this process (a stdlib child) inherits the pools, not their threads or workers:
# its exit leaves them to the parent (each pool also checks, for its finalizers' sake).
os.register_at_fork(after_in_child=_live_pools.clear)


class FiberExecutor(Executor):
    """An executor whose workers are local processes, containers or pods.

    It behaves like `concurrent.futures.ProcessPoolExecutor`: `submit`, `map`, `shutdown`,
    stdlib `Future`s (so `wait` and `as_completed` work unchanged). A task's exception is
    raised by its future with the worker's traceback in ``__cause__``; a worker that dies costs
    only the tasks it held, which are sent again, up to ``max_task_retries`` times.

    Args:
{arguments}

    Options left as ``None`` come from ``FIBEREXEC_*`` environment variables, then from
    ``.fiberexec.toml`` or ``[tool.fiberexec]`` in ``pyproject.toml``, then the defaults.

    Example:
        >>> with FiberExecutor(max_workers=2) as ex:  # doctest: +SKIP
        ...     list(ex.map(pow, [2, 3], [5, 2]))
        [32, 9]
    """

    def __init__(
        self,
        max_workers: int | None = None,
        mp_context: multiprocessing.context.BaseContext | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        backend: str | Backend | None = None,
        max_tasks_per_child: int | None = None,
        min_workers: int | None = None,
        idle_timeout: float | None = None,
        max_task_retries: int | None = None,
        shards: int | None = None,
        image: str | None = None,
        workdir: str | None = None,
        cpu: float | None = None,
        memory: int | str | None = None,
        gpu: int | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        heartbeat: float | None = None,
        silence_timeout: float | None = None,
        start_timeout: float | None = None,
        start_retry: RetryPolicy | None = None,
        backend_options: Mapping[str, Any] | None = None,
        progress: Callable[[Stats], None] | None = None,
        tls: TLSOptions | None = None,
        ports: str | int | tuple[int, int] | None = None,
        arg_cache: int | str | None = None,
        output: str | os.PathLike[str] | None = None,
        observe: bool | None = None,
        dashboard: bool | str | None = None,
    ) -> None:
        instance = backend if isinstance(backend, Backend) else None
        given = {k: v for k, v in locals().items() if k in BY_KEY or k in NOT_SETTINGS}
        given["backend"] = backend  # a name is checked against the registry here, at once
        given["initargs"] = tuple(initargs)
        self._config = resolve(given)
        self._mp_context = _check_mp_context(mp_context, self._config.max_tasks_per_child)
        self._backend = instance
        self._progress = progress
        self._pool: TaskPool | None = None
        self._taught = False  # the first task's imports were noted for the launcher (`_teach`)
        self._terminate_at_exit = False  # (set by `fiberexec.multiprocessing.Pool`)
        self._dashboard: Dashboard | None = None
        if self._config.dashboard is not None:
            from fiberexec._dashboard import check_installed

            check_installed()
        self._lock = threading.Lock()
        self._shutdown = False
        self._ids = itertools.count()
        self._executor_id = secrets.token_hex(4)

    def __repr__(self) -> str:
        """``<FiberExecutor max_workers=2 backend='local' running>``: what it is, at a glance."""
        broken = self._broken
        state = ("broken" if broken else "shut down" if self._shutdown
                 else "not started" if self._pool is None else "running")
        return (f"<{type(self).__name__} max_workers={self._config.max_workers} "
                f"backend={self._config.backend!r} {state}>")

    @property
    def max_workers(self) -> int:
        return self._config.max_workers

    @property
    def executor_id(self) -> str:
        """The id that names this executor wherever it shows: its workers' labels
        (``fiberexec.executor``), the log, ``fiberexec top`` and ``fiberexec cleanup
        --executor``, and its files in ``/dev/shm``. Fixed at construction."""
        return self._executor_id

    @property
    def _max_workers(self) -> int:  # the attribute's name in the standard library
        return self._config.max_workers

    @property
    def _broken(self) -> str | bool:
        """False, or why the executor broke (the standard library's attribute)."""
        pool = self._pool
        return False if pool is None or pool.broken is None else str(pool.broken)

    def _get_pool(self) -> TaskPool:
        if self._pool is None:
            dashboard = self._start_dashboard()  # first: if it cannot listen, nothing is built
            try:
                owns = self._backend is None
                backend = self._backend or load_backend(
                    self._config.backend, **self._config.backend_options
                )
                pool = TaskPool(self._config, backend, self._executor_id, owns_backend=owns,
                                progress=self._progress)
                pool.terminate_at_exit = self._terminate_at_exit
            except BaseException:
                if dashboard is not None:
                    dashboard.stop()
                raise
            if dashboard is not None:
                pool.on_close(dashboard.stop)
            self._pool = pool
            _live_pools.add(pool)
            weakref.finalize(self, pool.shutdown, wait=False, cancel_futures=False)
        return self._pool

    def _workers_share_host(self) -> bool:
        """Whether every worker runs on this host (`Backend.workers_share_host`)."""
        with self._lock:
            return not self._shutdown and self._get_pool().backend.workers_share_host

    def _start_workers(self) -> None:
        """Start the workers now, not at the first submit: `multiprocessing.Pool` starts
        its workers with the pool, so its initializer runs even if no task ever comes."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot start workers after shutdown")
            if not self._taught:
                self._teach(None, ())
            self._get_pool().start()

    def _wait_for_workers(self, count: int, timeout: float | None) -> bool:
        """Start the workers (`_start_workers`), then block until ``count`` are ready: True;
        False after ``timeout``. `BrokenFiberExecutor` if it broke meanwhile, `RuntimeError`
        if it was shut down."""
        self._start_workers()
        supervisor = self._get_pool().supervisor
        if supervisor.wait_ready(count, timeout):
            return True
        if supervisor.broken is not None:
            raise supervisor.broken
        if supervisor.halted:
            raise RuntimeError("the executor was shut down while it waited for its workers")
        return False

    def _start_dashboard(self) -> Dashboard | None:
        if self._config.dashboard is None:
            return None
        from fiberexec._dashboard import start

        source: Source = self  # mypy checks here that the executor is what the page reads
        # The server holds the executor weakly: an executor dropped is still collected.
        self._dashboard = start(self._config.dashboard, weakref.proxy(source),
                                self._config.tls,
                                announce=self._config.sources["dashboard"] != ARGUMENT)
        return self._dashboard

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's address with its token, or None when ``dashboard`` is off.

        The dashboard starts with the executor's workers (the first ``submit``), or here,
        if this is asked first; it serves until the executor's shutdown has ended (its
        workers are gone), so a run held up at its end by a straggler can be watched.

        Example:
            >>> ex = FiberExecutor(4, dashboard=True)  # doctest: +SKIP
            >>> ex.dashboard_url  # doctest: +SKIP
            'http://127.0.0.1:40123/?token=...'
        """
        with self._lock:
            if self._config.dashboard is None:
                return None
            if not self._shutdown:
                self._get_pool()
            dashboard = self._dashboard
            return None if dashboard is None or dashboard.stopped else dashboard.url

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Schedule ``fn(*args, **kwargs)`` and return a `Future` for its result."""
        with self._lock:
            if not self._taught:
                self._teach(fn, args)
            pool = self._pool_to_submit_to()
            future: Future[T] = TaskFuture()
            pool.submit(WorkItem(next(self._ids), future, fn, args, kwargs))
        return future

    def _submit_all(self, fn: Callable[..., T], calls: Iterable[tuple[Any, ...]],
                    snapshot: Snapshot | None = None) -> list[Future[T]]:
        """``submit(fn, *args)`` for each of ``calls``, handed to the scheduler together: a
        map's tasks go out to each worker in one message, not one by one as they come (an
        argument iterator that raises midway leaves those before it submitted, as the
        stdlib's map does). Calls read over more than `SUBMIT_AFTER` go as they come, and an
        iterator's first call goes at once, so no task waits to start for the input's end
        (nor a generator that waits for the first task's doing). A list's or tuple's calls,
        read at once, go together: sending the first alone would wake its worker for it,
        only for the rest to reach that worker in a second message it may sleep again for.

        The function (and a chunk's) is pickled here, before the first call goes: all the
        tasks read the script's globals as they are now, when the map is called, however
        late their batch is sent; ``snapshot`` is a map's that submits in parts."""
        futures: list[Future[T]] = []
        items: list[WorkItem] = []
        if snapshot is None:
            snapshot = Snapshot()
        with self._lock:  # (fails now, before the arguments are read, if it must)
            self._pool_to_submit_to()
        first_alone = not isinstance(calls, list | tuple)
        try:
            since = time.monotonic()
            for args in calls:  # (not under the lock: reading them may submit too)
                if not self._taught:
                    self._teach(fn, args)
                if not snapshot.pinned:
                    _pin(snapshot, fn, args)
                future: Future[T] = TaskFuture()
                items.append(WorkItem(next(self._ids), future, fn, args, {},
                                      snapshot=snapshot))
                futures.append(future)
                now = time.monotonic()
                if now - since > SUBMIT_AFTER or (first_alone and len(futures) == 1):
                    with self._lock:
                        self._pool_to_submit_to().submit_all(items)
                    items, since = [], now
        finally:
            with self._lock:
                self._pool_to_submit_to().submit_all(items)
        return futures

    def _teach(self, fn: Callable[..., Any] | None, args: tuple[Any, ...]) -> None:
        """Before the first workers start: the installed modules a worker imports to load
        the initializer and the first task's function (and a chunk's, its first argument),
        which the program's launcher may import once before it forks them
        (`_imports.learn_from`)."""
        self._taught = True
        for target in (self._config.initializer, fn, *args[:1]):
            if target is not None and callable(target):
                _imports.learn_from(target)

    def _pool_to_submit_to(self) -> TaskPool:
        """(Holding the lock.) Checked before any pool, thread or socket exists: a submit
        that must fail (from an atexit handler, say) builds nothing that could hold up the
        exit."""
        broken = self._pool.broken if self._pool is not None else None
        if broken is not None:
            raise type(broken)(*broken.args) from broken.__cause__
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        if _global_shutdown:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        return self._get_pool()

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[T]:
        """Like the builtin `map`, in parallel; ``chunksize`` items travel as one task.

        Args:
            buffersize: submit at most this many tasks (chunks, with ``chunksize``) ahead of
                the results consumed, reading the inputs lazily (Python 3.14's argument).

        Raises:
            TimeoutError: a result is not ready ``timeout`` seconds after this call.
        """
        if buffersize is not None and not isinstance(buffersize, int):
            raise TypeError("buffersize must be an integer or None")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0")
        try:
            chunksize = operator.index(chunksize)  # (what the stdlib's islice takes)
        except TypeError:  # the stdlib's: ValueError for 2.5 (islice's), TypeError for "2"
            kind = ValueError if isinstance(chunksize, numbers.Real) else TypeError
            raise kind(f"chunksize must be a whole number >= 1, got {chunksize!r}") from None
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        # Inputs in memory (not subclasses: those may read lazily) are read at once, and
        # their calls handed over together, as `_submit_all` does with a list: the first
        # need not go alone to wake its worker for it while the rest are read.
        known = buffersize is None and all(type(it) in _IN_MEMORY for it in iterables)
        if chunksize == 1:
            calls = zip(*iterables, strict=False)
            return _map(self, fn, list(calls) if known else calls, timeout, buffersize)
        chunks: Iterator[Sequence[Any]]
        if len(iterables) == 1:  # chunks of plain items, run by the builtin map (C speed)
            runner, items = map_chunk, iterables[0]
            if known:
                chunks = _slices(cast(Sequence[Any], items), chunksize)
            else:
                chunks = _chunks(iter(items), chunksize)
        else:
            runner, chunks = starmap_chunk, _chunks(zip(*iterables, strict=False), chunksize)
        runs = zip(itertools.repeat(fn), chunks)
        results = _map(self, runner, list(runs) if known else runs, timeout, buffersize)
        return itertools.chain.from_iterable(results)

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> bool | None:
        """`shutdown`, as any executor's ``with`` block ends; one that Ctrl-C ends (a
        ``KeyboardInterrupt``) first cancels what has not started and interrupts each
        running task (``KeyboardInterrupt`` in it), as a terminal's Ctrl-C, reaching the
        standard library's workers too, does: workers here run out of the terminal's
        reach, so the program passes it on, and waits for no task to its end."""
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            # Passed on with signals held: a second Ctrl-C must not cut it short. One that
            # cuts this block's end short before it (or the shutdown after) leaves the
            # executor in `_main_blocks`, whose tasks the exit interrupts.
            held = _interrupts.hold()
            try:
                with self._lock:
                    pool = self._pool
                if pool is not None:
                    pool.interrupt()
            finally:
                _interrupts.release(held)
        ended = super().__exit__(exc_type, exc_val, exc_tb)
        _main_blocks.discard(self)
        return ended

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():  # where Ctrl-C lands
            _main_blocks.add(self)
        return self

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting tasks; with ``wait``, return once workers are gone."""
        with self._lock:
            self._shutdown = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def terminate(self) -> None:
        """Stop every worker now, even mid-task, and fail what has not finished.

        Unlike `shutdown`, nothing is waited for: futures not yet done raise
        `BrokenFiberExecutor`, and running tasks are killed with their workers. This is what
        `multiprocessing.Pool.terminate` needs, and what a timed-out caller can use.
        """
        with self._lock:
            self._shutdown = True
            pool = self._pool
        if pool is not None:
            pool.break_executor("the executor was terminated", None, level=logging.INFO)
            pool.shutdown(wait=True, cancel_futures=True)

    def terminate_workers(self) -> None:
        """Shut down now: cancel what is queued and SIGTERM every worker (3.14 API).

        Tasks running on the workers, and those a worker holds to run next (as the stdlib's
        call queue holds ``max_workers + 1``), fail with `BrokenFiberExecutor` (a
        `BrokenProcessPool`); nothing is waited for. Submitting afterwards raises
        `BrokenFiberExecutor`, a `RuntimeError`.
        """
        self._force_shutdown(operation=_TERMINATE)

    def kill_workers(self) -> None:
        """Like `terminate_workers`, with SIGKILL (3.14 API)."""
        self._force_shutdown(operation=_KILL)

    def _force_shutdown(self, operation: str) -> None:
        if operation not in _GRACE:
            raise ValueError(f"Unsupported operation: {operation!r}")
        with self._lock:
            self._shutdown = True
            pool = self._pool
        if pool is not None:
            pool.force_stop(f"the executor was forcefully shut down ({operation})",
                            grace=_GRACE[operation])

    def stats(self) -> Stats:
        """A snapshot of workers and tasks (see `Stats`)."""
        with self._lock:
            pool = self._pool
        if pool is None:
            return Stats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)
        return pool.stats()

    def workers(self) -> list[WorkerInfo]:
        """Each worker's state and the task it runs, then workers recently gone.

        Cheap enough to call every second (about 2-7 ms for a thousand workers) and never
        holds up dispatch: it reads what the scheduler last recorded, a moment old at most.
        Workers that left or were lost stay listed (the last 256) as ``"retired"`` or
        ``"lost"``.

        Returns:
            A list of `WorkerInfo`, live workers first.

        Example:
            >>> for w in ex.workers():  # doctest: +SKIP
            ...     if w.task: print(w.worker_id, w.host, w.task.function, w.task.arguments)
        """
        pool = self._pool
        return [] if pool is None else pool.workers()

    def task_spans(self, since: float = 0.0, limit: int | None = None) -> list[TaskSpan]:
        """Finished tasks (the last 10,000 per shard), oldest first, for a task-stream view.

        Args:
            since: a `time.time` value: only tasks that ended at or after it.
            limit: at most this many, the newest (None: all).
        """
        pool = self._pool
        return [] if pool is None else pool.task_spans(since, limit)

    def task_durations(self) -> Durations:
        """How long every task finished so far ran on its worker, as a histogram (see
        `Durations`); unlike `task_spans`, no task is left out however many ran."""
        pool = self._pool
        return _observe.durations(()) if pool is None else pool.durations()

    def failures(self, limit: int = 20) -> list[FailureInfo]:
        """The last ``limit`` tasks that failed (raised, or lost their workers), oldest
        first, each with its function, arguments, error and the worker's traceback text."""
        pool = self._pool
        return [] if pool is None else pool.failures(limit)

    def dump_stack(self, worker_id: str, timeout: float = 5.0) -> str:
        """The Python stack of every thread of a worker, the running task's first.

        The worker answers from a thread other than the one running the task, so a task
        stuck in a loop or a wait shows where it is. (A task holding the interpreter's lock
        in native code keeps that thread from answering.)

        Args:
            worker_id: as in `workers` (``"w3"``).
            timeout: seconds to wait for the answer.

        Raises:
            LookupError: no connected worker has that id (unknown, not connected yet, or
                gone; one running its initializer answers).
            TimeoutError: no answer within ``timeout`` seconds.

        Example:
            >>> print(ex.dump_stack("w0"))  # doctest: +SKIP
        """
        pool = self._pool
        if pool is None:
            raise LookupError(f"no worker {worker_id!r}: the executor has started no worker "
                              f"yet (submit a task first)")
        return pool.dump_stack(worker_id, timeout)


_TERMINATE, _KILL = "terminate", "kill"  # the standard library's operation names
_GRACE = {_TERMINATE: 2.0, _KILL: 0.0}  # seconds between SIGTERM and SIGKILL


_NOT_SETTINGS_DOC = {
    "initializer": "called with ``*initargs`` in each worker before its first task; if it "
                   "raises, the executor becomes broken (`BrokenFiberExecutor`).",
    "initargs": "the arguments of ``initializer``.",
    "progress": "called with `Stats` as tasks finish (at most 10 times a second).",
    "tls": "`TLSOptions` to encrypt every connection to the workers (untrusted networks).",
    "mp_context": "accepted for compatibility with `ProcessPoolExecutor`; workers are always "
                  "fresh programs, whatever the start method (``max_tasks_per_child`` with a "
                  "``\"fork\"`` context is refused, as the standard library does).",
}
FiberExecutor.__doc__ = (FiberExecutor.__doc__ or "").replace("{arguments}", document(
    [n for n in inspect.signature(FiberExecutor.__init__).parameters if n != "self"],
    _NOT_SETTINGS_DOC,
))

def _check_mp_context(
    context: multiprocessing.context.BaseContext | None, max_tasks_per_child: int | None
) -> multiprocessing.context.BaseContext:
    """Accept the standard library's ``mp_context``; workers are always fresh programs."""
    if context is None:
        return multiprocessing.get_context("spawn")
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise ConfigurationError(
            f"mp_context must be a multiprocessing context or None, got {context!r}; "
            "pass multiprocessing.get_context('spawn') or leave it out"
        )
    if max_tasks_per_child is not None and context.get_start_method() == "fork":
        raise ValueError("max_tasks_per_child is incompatible with the 'fork' "
                         "multiprocessing start method; supply a different mp_context.")
    return context


def _chunks(items: Iterator[Any], size: int) -> Iterator[tuple[Any, ...]]:
    while chunk := tuple(itertools.islice(items, size)):
        yield chunk


_IN_MEMORY = (list, tuple, range)


def _slices(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Chunks of a list, tuple or range, taken as slices: a list's or tuple's copies its
    pointers, a range's is a range (no item made here, a few bytes to pickle; the worker
    makes them)."""
    return (items[i:i + size] for i in range(0, len(items), size))


def _map(
    executor: Executor,
    fn: Callable[..., T],
    args: Iterator[tuple[Any, ...]] | list[tuple[Any, ...]],
    timeout: float | None,
    buffersize: int | None,
) -> Iterator[T]:
    """`Executor.map` as Python 3.14 has it: submits now (``buffersize`` of them, lazily;
    an iterator's, as it reads them; a list's together)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    more = iter(args) if buffersize else None  # (read as results are consumed)
    head = args if more is None else itertools.islice(more, buffersize)
    ours = isinstance(executor, FiberExecutor)  # (ours: all at once, one snapshot)
    if getattr(executor.submit, "__func__", None) is not FiberExecutor.submit:
        ours = False  # a subclass's or a wrapper's submit sees each call, as in the stdlib
    snapshot = Snapshot() if ours else None
    futures = collections.deque(
        cast(FiberExecutor, executor)._submit_all(fn, head, snapshot) if ours
        else (executor.submit(fn, *a) for a in head))
    ref = weakref.ref(executor)  # the iterator must not keep the executor alive
    return _results(futures, more, ref, fn, deadline, snapshot)


def _results(  # noqa: PLR0917  # (the map's parts, handed on)
    futures: collections.deque[Future[T]],
    more: Iterator[tuple[Any, ...]] | None,
    ref: weakref.ref[Executor],
    fn: Callable[..., T],
    deadline: float | None,
    snapshot: Snapshot | None,
) -> Iterator[T]:
    try:
        futures.reverse()  # pop() from the right keeps submission order
        while futures:
            if more is not None and (executor := ref()) is not None:
                args = next(more, None)
                if args is not None:
                    futures.appendleft(
                        executor.submit(fn, *args) if snapshot is None
                        else cast(FiberExecutor, executor)._submit_all(fn, [args], snapshot)[0])
                del executor
            yield _result_or_cancel(futures.pop(), deadline)
    finally:
        for future in futures:
            _cancel(future)


def _pin(snapshot: Snapshot, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Pickle a map's function, and a chunk's (its first argument), into ``snapshot`` now,
    once. One that cannot be pickled is left to fail each task, as a submitted one does."""
    try:
        dumps_function(fn, snapshot)
        kept_functions(args, snapshot)
    except Exception:  # (each task's future says why)
        snapshot.kept.clear()
    snapshot.pinned = True


def _result_or_cancel(future: Future[T], deadline: float | None) -> T:
    try:
        timeout = None if deadline is None else deadline - time.monotonic()
        return future.result(timeout)
    finally:
        _cancel(future)
        del future  # no reference cycle through the exception's traceback


def _cancel(future: Future[Any]) -> None:
    """Cancel what will not be returned, not waiting for a worker holding it to answer (the
    stdlib's cancel never waits: a ``map`` timeout is raised on time)."""
    if isinstance(future, TaskFuture):
        future.cancel_soon()
    else:
        future.cancel()


__all__ = ["FiberExecutor"]
