"""The joblib backend ``"fiber"``: `joblib.Parallel` batches run as `FiberExecutor` tasks.

Data flow::

    Parallel --submit(BatchedCalls)--> FiberBackend --executor.submit(operator.call, batch)-->
    FiberExecutor (warm, one per option set) --> workers
    future done (shard thread) --> _CallbackRelay thread --> joblib's completion callback
                                   (records the result, dispatches the next batch)

Completion callbacks run on a relay thread of their own, never on the executor's scheduling
thread: joblib's callback consumes the caller's iterator to dispatch more work, and user code
must not stall scheduling.

Executors are kept warm across `Parallel` calls (as joblib's loky backend reuses its workers),
one per set of executor options (a call with another ``n_jobs`` replaces an idle one of the same
options, as loky resizes its one); `shutdown_executors()` stops them, and so does interpreter
exit.
Warm executors default to ``min_workers=0, idle_timeout=300`` so idle workers go away, as loky's
do after ``idle_worker_timeout=300``.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import operator
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import BrokenExecutor, Future
from typing import Any

from joblib.externals.loky.process_executor import TerminatedWorkerError
from joblib.parallel import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
    ThreadingBackend,
    cpu_count,
)

from fiberexec._contract import ENV_ADDRESS
from fiberexec._errors import ConfigurationError, WorkerLostError
from fiberexec._executor import FiberExecutor
from fiberexec._joblib_memmap import ArrayStore, run_packed
from fiberexec._observe import WorkerInfo
from fiberexec._registry import check_backend_name

log = logging.getLogger("fiberexec")

# What joblib itself passes to configure(); meaningful for its loky/multiprocessing backends only.
_JOBLIB_KWARGS = frozenset({"max_nbytes", "temp_folder", "mmap_mode", "verbose", "context"})
# What FiberBackend accepts: FiberExecutor's arguments, its backend under the name
# ``executor_backend`` (``backend=`` is joblib's, in parallel_config).
_OPTIONS = (frozenset(inspect.signature(FiberExecutor).parameters) - {"backend"}
            | {"executor_backend"})
_WARM_DEFAULTS: Mapping[str, Any] = {"min_workers": 0, "idle_timeout": 300.0}
MAX_WARM = 4  # distinct option sets kept warm at once; the least recently used goes first
_STOP = object()


def in_worker() -> bool:
    """Whether this process is a fiberexec worker (or was started by one)."""
    return ENV_ADDRESS in os.environ


# ---------------------------------------------------------------- options


def executor_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate options meant for `FiberExecutor`; ``executor_backend`` names its backend.

    ``parallel_config(backend="fiber", ...)`` already uses ``backend``, so the executor's
    backend travels as ``executor_backend="docker"``.
    """
    opts = dict(options)
    if "executor_backend" in opts:
        if "backend" in opts:
            raise ConfigurationError(
                "give the executor's backend once: executor_backend= or backend=, not both"
            )
        opts["backend"] = opts.pop("executor_backend")
        if isinstance(opts["backend"], str):  # named as the user typed it
            check_backend_name(opts["backend"], "the executor_backend= option")
    unknown = sorted(set(opts) - _OPTIONS - {"backend"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], _OPTIONS, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigurationError(
            f"the fiber joblib backend got unknown option(s) {unknown}; {guess}it accepts "
            f"FiberExecutor's options {sorted(_OPTIONS)}"
        )
    return opts


def _freeze(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | set | frozenset):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value  # type: ignore[no-any-return]


# ---------------------------------------------------------------- callback relay


class _CallbackRelay:
    """One thread that runs joblib's completion callbacks in completion order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def deliver(self, callback: Callable[[Future[Any]], object]) -> Callable[[Future[Any]], None]:
        """A done-callback for a future that hands ``callback`` to the relay thread."""
        self._ensure_running()
        return lambda future: self._queue.put((callback, future))

    def _ensure_running(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="fiberexec-joblib-callbacks", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            callback, future = item
            try:
                callback(future)
            except BaseException:  # joblib records task errors itself; this is a bug
                log.exception("a joblib completion callback raised")

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            self._queue.put(_STOP)
            thread.join(timeout)


# ---------------------------------------------------------------- warm executors


class _WarmExecutors:
    """Executors kept across `Parallel` calls, one per option set, least recently used last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, Hashable], FiberExecutor] = OrderedDict()

    def get(self, n_jobs: int, options: Mapping[str, Any]) -> FiberExecutor:
        """The warm executor of ``n_jobs`` workers and ``options``. One of the same options
        and another size that is idle makes way for it, as loky's one executor is resized:
        a program whose calls vary ``n_jobs`` keeps one pool, not one per size."""
        frozen = _freeze(options)
        key = (n_jobs, frozen)
        evicted: list[FiberExecutor] = []
        with self._lock:
            executor = self._entries.get(key)
            if executor is None:
                for (size, other), old in list(self._entries.items()):
                    if other == frozen and size != n_jobs and _idle(old):
                        evicted.append(self._entries.pop((size, other)))
                executor = FiberExecutor(n_jobs, **{**_WARM_DEFAULTS, **options})
                self._entries[key] = executor
                while len(self._entries) > MAX_WARM:
                    evicted.append(self._entries.popitem(last=False)[1])
            self._entries.move_to_end(key)
        for old in evicted:
            old.shutdown(wait=False)  # submitted tasks still finish
        return executor

    def discard(self, executor: FiberExecutor) -> None:
        with self._lock:
            for key, value in list(self._entries.items()):
                if value is executor:
                    del self._entries[key]

    def executors(self) -> list[FiberExecutor]:
        with self._lock:
            return list(self._entries.values())

    def shutdown_all(self, wait: bool) -> None:
        with self._lock:
            executors = list(self._entries.values())
            self._entries.clear()
        for executor in executors:
            executor.shutdown(wait=False, cancel_futures=True)
        if wait:
            for executor in executors:
                executor.shutdown(wait=True)


def _idle(executor: FiberExecutor) -> bool:
    """Whether no task of ``executor`` is queued or running (no call is using it)."""
    stats = executor.stats()
    return stats.tasks_pending == 0 and stats.tasks_running == 0


_relay = _CallbackRelay()
_warm = _WarmExecutors()


def shutdown_executors(wait: bool = True) -> None:
    """Stop every executor the ``"fiber"`` backend keeps warm between `Parallel` calls.

    Queued tasks are cancelled; with ``wait``, return once their workers are gone. The next
    `Parallel` call starts a fresh executor. Interpreter exit does this on its own.
    """
    _warm.shutdown_all(wait)
    _relay.stop()


def workers() -> list[WorkerInfo]:
    """The workers of every executor the ``"fiber"`` backend keeps warm (see
    `FiberExecutor.workers`); those of a ``reuse=False`` backend: `FiberBackend.workers`."""
    return [info for executor in _warm.executors() for info in executor.workers()]


# ---------------------------------------------------------------- the backend


class FiberBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]
    """joblib backend running each batch of `Parallel` tasks as a `FiberExecutor` task.

    Select it with ``parallel_config(backend="fiber", n_jobs=N, **options)`` or
    ``Parallel(backend="fiber")`` after ``import fiberexec.joblib``. ``options`` are
    `FiberExecutor` arguments (``image=``, ``max_task_retries=``, ``cpu=``, ...), with the
    executor's backend given as ``executor_backend="docker"``.

    Args:
        reuse: keep the executor warm for later calls with the same options (default), or
            start one per `Parallel` call and shut it down when the call ends.
        max_workers: the worker count ``n_jobs=-1`` means (default: this machine's CPUs);
            ``n_jobs=-2`` is one fewer, and so on.

    Each worker's numerical libraries (OpenMP, OpenBLAS, MKL...) get this machine's CPUs
    shared among the workers, or ``inner_max_num_threads`` of ``parallel_config``, as
    joblib's loky backend sets them (the ``env`` option adds to or overrides that).

    Inside a fiberexec worker, ``"fiber"`` falls back to threads: workers do not start workers.
    Nested `Parallel` calls inside tasks run on threads (then sequentially), as with loky.

    Raises:
        ConfigurationError: an option `FiberExecutor` does not accept.
    """

    supports_retrieve_callback = True
    supports_inner_max_num_threads = True
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = 1

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        *,
        reuse: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self.reuse = reuse
        self.options = executor_options(options)
        self.parallel: Any = None
        self._call_options = self.options
        self._n_jobs = 1
        self._executor: FiberExecutor | None = None
        self._futures: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._arrays = ArrayStore(None, None)  # this call's memory-mapped arrays

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable as its settings: a live executor, locks and futures stay behind.
        return (_rebuild, (self.nesting_level, self.reuse, self.options))

    # ------------------------------------------------------------ sizing

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """joblib's rule: ``None`` is 1, ``-1`` all CPUs, ``-k`` all but ``k - 1``; 0 errs."""
        if n_jobs == 0:
            raise ValueError(
                "n_jobs == 0 in Parallel has no meaning; use n_jobs >= 1, or -1 for all CPUs"
            )
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            capacity = self.options.get("max_workers") or cpu_count()
            return max(int(capacity) + 1 + n_jobs, 1)
        return int(n_jobs)

    def configure(
        self,
        n_jobs: int | None = 1,
        parallel: Any = None,
        prefer: str | None = None,
        require: str | None = None,
        **kwargs: Any,
    ) -> int:
        """Settle this call's worker count and options; 1 job runs sequentially, as joblib does."""
        n = self.effective_n_jobs(n_jobs)
        if in_worker():
            raise FallbackToBackend(ThreadingBackend(nesting_level=self._level()))
        if n == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self._arrays.close()
        self._arrays = ArrayStore(kwargs.get("max_nbytes"), kwargs.get("mmap_mode"),
                                  kwargs.get("temp_folder"))
        extra = {k: v for k, v in kwargs.items() if k not in _JOBLIB_KWARGS}
        self._call_options = {**self.options, **executor_options(extra)}
        self._call_options.pop("max_workers", None)
        self._call_options["env"] = {**self._thread_limits(n),
                                     **(self._call_options.get("env") or {})}
        self._n_jobs = n
        self.parallel = parallel
        self._get_executor()  # joblib's process backends hold their pool from here on
        return n

    def _thread_limits(self, n_jobs: int) -> dict[str, str]:
        """The numerical libraries' thread counts in each worker, as joblib sets them for
        loky's: ``inner_max_num_threads`` if given, else what the caller's environment
        says, else this machine's CPUs shared among the ``n_jobs`` workers (a worker given
        ``cpu=`` CPUs gets that many): so workers do not start a thread per core each."""
        limits: dict[str, str] = self._prepare_worker_env(n_jobs)
        try:
            cpu = max(int(float(self._call_options["cpu"])), 1)
        except (KeyError, TypeError, ValueError):  # none given (a bad one: the executor says)
            return limits
        if self.inner_max_num_threads is None:
            limits.update({var: os.environ.get(var, str(cpu))
                           for var in self.MAX_NUM_THREADS_VARS})
        return limits

    def _level(self) -> int:
        return (self.nesting_level or 0) + 1

    # ------------------------------------------------------------ running

    @property
    def _workers(self) -> FiberExecutor | None:
        """The executor this call runs on (joblib's name for a backend's pool of workers:
        its tests look here to see a pool restarted after an error, and gone after a call)."""
        return self._executor

    def _get_executor(self) -> FiberExecutor:
        if self._executor is None:
            if self.reuse:
                self._executor = _warm.get(self._n_jobs, self._call_options)
            else:
                self._executor = FiberExecutor(self._n_jobs, **self._call_options)
        return self._executor

    def workers(self) -> list[WorkerInfo]:
        """This backend's executor's workers (see `FiberExecutor.workers`); [] before any."""
        executor = self._executor
        return [] if executor is None else executor.workers()

    def submit(self, func: Callable[[], Any], callback: Any = None) -> Future[Any]:
        """Send one batch; joblib's ``callback`` runs on the relay thread once it is done."""
        future = self._submit_once(func)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        if callback is not None:
            future.add_done_callback(_relay.deliver(callback))
        return future

    def _submit_once(self, func: Callable[[], Any]) -> Future[Any]:
        executor = self._get_executor()
        try:
            return self._submit_to(executor, func)
        except (BrokenExecutor, RuntimeError):
            # A warm executor that broke, or that shutdown_executors() stopped: try a fresh one.
            _warm.discard(executor)
            self._executor = None
            if not self.reuse:
                raise
            return self._submit_to(self._get_executor(), func)

    def _submit_to(self, executor: FiberExecutor, func: Callable[[], Any]) -> Future[Any]:
        """Large arrays, and arrays that map files, go as shared memory maps to workers on
        this host (as loky's); a batch whose packing fails goes as it is, for the
        executor's own error."""
        if executor._workers_share_host():
            try:
                packed = self._arrays.pack(func)
            except Exception:
                packed = None
            if packed is not None:
                payload, done = packed
                try:
                    future = executor.submit(run_packed, payload)
                except BaseException:
                    done()
                    raise
                future.add_done_callback(lambda _: done())
                return future
        return executor.submit(operator.call, func)

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)

    def retrieve_result_callback(self, out: Future[Any]) -> Any:
        """The batch's results, or the exception its task raised (traceback in ``__cause__``).
        A batch whose workers kept dying raises `WorkerLostError` that is also loky's
        ``TerminatedWorkerError``, which code written for joblib's default backend catches."""
        try:
            return out.result()
        except WorkerLostError as exc:
            raise _as_terminated(exc) from exc.__cause__

    # ------------------------------------------------------------ ending a call

    def terminate(self) -> None:
        """End of a `Parallel` call: keep a warm executor, shut down a per-call one."""
        executor, self._executor = self._executor, None
        if executor is not None and not self.reuse:
            executor.shutdown(wait=True)
        self._arrays.close()  # every task of the call is done
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """First error, timeout or dropped generator: cancel queued batches and restart the
        pool, as loky does: batches still running are stopped with their workers (their
        results would be ignored, and one may never return), and with ``ensure_ready`` a
        fresh executor takes over for the calls that follow."""
        with self._lock:
            futures, self._futures = list(self._futures), set()
        for future in futures:
            future.cancel()
        running = any(not f.done() for f in futures)
        executor, self._executor = self._executor, None
        if executor is not None:
            _warm.discard(executor)
            if running:
                executor.terminate()
            else:
                executor.shutdown(wait=False, cancel_futures=True)
        self._arrays.close()  # what could still read it was cancelled or stopped
        self.reset_batch_stats()
        if ensure_ready:
            self._get_executor()

    def get_nested_backend(self) -> tuple[ParallelBackendBase, int | None]:
        """Nested calls inside a task use threads; deeper ones run sequentially (as loky)."""
        level = self._level()
        if level > 1:
            return SequentialBackend(nesting_level=level), None
        return ThreadingBackend(nesting_level=level), None


def _rebuild(nesting_level: int | None, reuse: bool, options: dict[str, Any]) -> FiberBackend:
    return FiberBackend(nesting_level=nesting_level, reuse=reuse, **options)


class TerminatedWorkerLostError(WorkerLostError, TerminatedWorkerError):  # type: ignore[misc]
    """`WorkerLostError` that is also loky's ``TerminatedWorkerError`` (raised by joblib
    calls on the fiber backend, so ``except TerminatedWorkerError`` catches it)."""


def _as_terminated(exc: WorkerLostError) -> WorkerLostError:
    error = TerminatedWorkerLostError(*exc.args)
    error.__dict__.update(exc.__dict__)
    return error.with_traceback(exc.__traceback__)


__all__ = ["FiberBackend", "in_worker", "shutdown_executors"]
