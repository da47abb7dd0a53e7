"""`Pool`: the `multiprocessing.Pool` API as a thin layer over `FiberExecutor`.

    Pool.apply_async / map_async / imap ...      chunks of work become executor tasks
            |  submit(_mapstar, fn, chunk)
    FiberExecutor (the only scheduler)           Futures complete on the executor's threads
            |  add_done_callback
    ApplyResult / MapResult / IMapIterator       callbacks run, then the result is ready

A worker that dies or a result that cannot be unpickled fails its future (the executor's
`WorkerLostError` / `SerializationError`), so the result raises instead of hanging.
Errors are given the standard library's shapes as they come out: the remote traceback in
``__cause__`` becomes a `multiprocessing.pool.RemoteTraceback`, and a result the worker
could not send becomes `multiprocessing.pool.MaybeEncodingError`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import multiprocessing.pool
import os
import pickle
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import TYPE_CHECKING, Any, cast

from fiberexec import _future
from fiberexec._backend import Backend, Resources, parse_memory
from fiberexec._chunks import map_chunk, starmap_chunk
from fiberexec._config import BY_KEY, NOT_SETTINGS, resolve
from fiberexec._errors import SerializationError
from fiberexec._executor import FiberExecutor
from fiberexec._future import TaskFuture
from fiberexec._observe import WorkerInfo
from fiberexec._serialize import Snapshot, pickler_error
from fiberexec.multiprocessing._backends import (
    BackendLike,
    Meta,
    meta_of,
    new_backend,
    note_unenforced,
)
from fiberexec.multiprocessing._errors import ProcessError, TimeoutError
from fiberexec.multiprocessing._process import ENV_POOL_PARENT, current_process

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"
Callback = Callable[[Any], object] | None


# Chunk runners live in a module workers can import without the executor's machinery.
_mapstar, _starmapstar = map_chunk, starmap_chunk


def _chunks(iterable: Iterable[Any], size: int) -> Iterator[tuple[Any, ...]]:
    it = iter(iterable)
    while chunk := tuple(itertools.islice(it, size)):
        yield chunk


def _outcome(future: Future[Any], *, item: bool = False) -> tuple[bool, Any]:
    """What ``future`` gave, as the pool's result; ``item``: one map item run alone (an
    unpicklable result is shown in a list, as in the standard library, which sends a chunk
    of one item as a list)."""
    if future.cancelled():
        return False, ProcessError("the pool was terminated before this task finished")
    exc = future.exception()
    return (True, future.result()) if exc is None else (False, _as_stdlib(exc, in_list=item))


_STD_POOL = vars(importlib.import_module("multiprocessing.pool"))  # these are not in typeshed
_REMOTE_TRACEBACK: type[Exception] = _STD_POOL["RemoteTraceback"]
_MAYBE_ENCODING: type[Exception] = _STD_POOL["MaybeEncodingError"]


def _as_stdlib(exc: BaseException, *, in_list: bool = False) -> BaseException:
    """The error as `multiprocessing.Pool` raises it (see the module docstring);
    ``in_list``: an unpicklable result is shown in a list (`_outcome`)."""
    cause = exc.__cause__
    if _is_remote_traceback(cause) and not isinstance(cause, _REMOTE_TRACEBACK):
        exc.__cause__ = _REMOTE_TRACEBACK(str(cause))
    if isinstance(exc, SerializationError | pickle.PicklingError):
        if "pickle the result" in str(exc):  # as the stdlib's: the pickler's error, the value
            shown, reason = getattr(exc, "shown", None), getattr(exc, "reason", None)
            shown = shown or "<the result>"
            unsent = _MAYBE_ENCODING(_Shown(reason or repr(exc)),
                                     _Shown(f"[{shown}]" if in_list else shown))
            unsent.__cause__ = exc
            return unsent
        if "cannot be pickled to be sent back" in str(exc):  # the task's exception: also
            # the stdlib's MaybeEncodingError (the exception, and what pickling it raised)
            what, _, reason = str(exc).partition(", which cannot be pickled to be sent back: ")
            unsent = _MAYBE_ENCODING(_Shown(reason), _Shown(what.removeprefix("the task raised ")))
            unsent.__cause__ = exc
            return unsent
        if "pickle the arguments" in str(exc):
            return pickler_error(exc)  # the stdlib raises what the pickler raised
    if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: see `_ended_worker`
        return _ended_worker(exc)
    return exc


def _ended_worker(exc: BaseException) -> ProcessError:
    """A task's ``SystemExit`` or ``KeyboardInterrupt``, as the pool's error: in the
    standard library's pool it ends the worker and the task's result never comes (``get``
    waits for ever); re-raised here, it would end the program that asked (``except
    Exception`` lets it through). So it fails the task, naming what it raised."""
    error = ProcessError(
        f"the task raised {exc!r}, which in multiprocessing.Pool ends its worker (the "
        "standard library's pool never returns that task's result); raise an Exception "
        "to fail a task")
    error.__cause__ = exc
    return error


class _Shown(str):
    """A repr already made, given where `MaybeEncodingError` takes a value to ``repr``."""

    def __repr__(self) -> str:
        return str(self)


def _is_remote_traceback(cause: object) -> bool:
    return isinstance(cause, Exception) and type(cause).__name__.endswith("RemoteTraceback")


if TYPE_CHECKING:  # (the stdlib's is generic only in its stubs)
    _IMapBase = multiprocessing.pool.IMapIterator[Any]
else:
    _IMapBase = multiprocessing.pool.IMapIterator

IMAP_AHEAD = 64  # chunks imap keeps submitted ahead of the results consumed (at least)

class ApplyResult(multiprocessing.pool.ApplyResult[Any]):
    """The result of `Pool.apply_async` (``AsyncResult`` in the standard library)."""

    def __init__(self, callback: Callback = None, error_callback: Callback = None) -> None:
        self._event = threading.Event()
        self._callback, self._error_callback = callback, error_callback
        self._success = False
        self._value: Any = None
        self._task: TaskFuture[Any] | None = None  # its one task's, where `wait` may read it

    def ready(self) -> bool:
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call returned without raising; ValueError if it is not ready yet."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Wait until it is ready, at most ``timeout`` seconds.

        The result of one task with no callback to run: the waiting thread reads the
        worker's answer itself where the submitting thread sent the task, and takes it in
        there, with no thread hand-off (`TaskFuture.collect`). (A callback runs on the
        shard's thread, as the standard library runs it on its own, before `get` returns.
        A map's waiting thread does not read: the first answers of a map of quick tasks come
        back while the submitting thread still sends the others, and wake the shard's
        thread anyway.)"""
        if self._task is not None and not self._event.is_set():
            timeout = self._task.collect(timeout)
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The return value, or raise what the call raised; `TimeoutError` after ``timeout``."""
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError
        if self._success:
            return self._value
        raise self._value

    def _set(self, success: bool, value: Any) -> None:
        self._success, self._value = success, value
        callback = self._callback if success else self._error_callback
        if callback is not None:
            try:
                callback(value)
            except Exception as exc:  # on stderr, as the stdlib's result thread's end says it
                threading.excepthook(threading.ExceptHookArgs(
                    (type(exc), exc, exc.__traceback__, threading.current_thread())))
        self._event.set()

    def _watch(self, futures: Sequence[Future[Any]]) -> None:
        """Take in each of ``futures`` as it is done. With no callback of the user's, on
        whichever thread settles it: one waiting here (see `wait`) too."""
        prompt = self._callback is None and self._error_callback is None
        if prompt and len(futures) == 1 and isinstance(futures[0], TaskFuture):
            self._task = futures[0]
        for index, future in enumerate(futures):
            take = functools.partial(self._taken_in, index)
            future.add_done_callback(_future.Prompt(take) if prompt else take)

    def _taken_in(self, index: int, future: Future[Any]) -> None:
        self._set(*_outcome(future))


AsyncResult = ApplyResult


class MapResult(ApplyResult, multiprocessing.pool.MapResult[Any]):
    """The result of `Pool.map_async` / `starmap_async`: a list once every chunk is back
    (``items``: each task ran one item, and gave its value rather than a chunk's list)."""

    def __init__(self, tasks: int, callback: Callback, error_callback: Callback,
                 *, items: bool = False) -> None:
        super().__init__(callback, error_callback)
        self._items = items
        self._parts: list[Any] = [None] * tasks  # each task's value (a chunk's: its list)
        self._left = tasks
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        if not tasks:  # done at once, and (as the stdlib's) without calling back
            self._success, self._value = True, []
            self._event.set()

    def _taken_in(self, index: int, future: Future[Any]) -> None:
        success, value = _outcome(future, item=self._items)
        with self._lock:
            if success:
                self._parts[index] = value
            elif self._error is None:
                self._error = value  # the first failure wins, as in the standard library
            self._left -= 1
            last = self._left == 0
        if last:
            if self._error is None:
                self._set(True, self._parts if self._items
                          else list(itertools.chain.from_iterable(self._parts)))
            else:
                self._set(False, self._error)


def _check_options(processes: int, extra: Mapping[str, Any], options: Mapping[str, Any],
                   backend: object) -> None:
    """What `FiberExecutor` would say of a pool's options at its first task, said as the
    pool is made: a keyword (of the ``extra`` ones the caller gave) it does not take, or a
    value a setting refuses."""
    unknown = sorted(set(extra) - _POOL_KEYWORDS)
    if unknown:
        raise TypeError(
            f"Pool() got unexpected keyword argument(s) {', '.join(unknown)}: it takes the "
            f"standard library's arguments (maxtasksperchild, ...), backend=, error_handling= "
            f"and FiberExecutor's keywords ({', '.join(sorted(_POOL_KEYWORDS))})")
    given = {key: value for key, value in options.items() if key in _SETTING_KEYWORDS}
    if isinstance(backend, str | Backend):  # (a factory is called at the first task)
        given["backend"] = backend
    resolve({**given, "max_workers": processes})


# (``max_tasks_per_child`` is the standard library's ``maxtasksperchild`` here)
_POOL_KEYWORDS = frozenset(
    name for name, parameter in inspect.signature(FiberExecutor.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    and name not in ("backend", "max_tasks_per_child"))
_SETTING_KEYWORDS = frozenset(BY_KEY) | frozenset(NOT_SETTINGS)


_RESOURCES = frozenset({"cpu", "memory", "gpu"})


def _described(hint: Meta | None) -> str:
    if hint is None:
        return "no resources asked (no meta)"
    return f"cpu={hint.cpu}, memory={hint.memory}, gpu={hint.gpu}"


def _generator(results: IMapIterator) -> Iterator[Any]:
    """Chunked results as the stdlib hands them out: a generator, which an item's error
    ends (the chunks after it run, as the stdlib's do, and are not handed out)."""
    yield from results


class IMapIterator(_IMapBase):
    """Results of `Pool.imap` / `imap_unordered`, pulling the input lazily.

    At most ``window`` chunks are in flight; more are taken from the input as results are
    consumed (once half the window is free: they go to the workers together, a message a
    worker), so an endless generator works with a bounded consumer. ``items``: each task
    runs one item and gives its value, not a chunk's list.
    """

    def __init__(self, submit: Callable[[Iterator[tuple[Any, ...]]], list[Future[Any]]],
                 source: Iterator[tuple[Any, ...]], window: int, ordered: bool,
                 items: bool = False) -> None:
        self._submit, self._source = submit, source
        self._window, self._ordered, self._items = window, ordered, items
        self._inflight: deque[Future[list[Any]]] = deque()
        self._finished: deque[Future[list[Any]]] = deque()  # unordered: as they finish
        self._arrived = threading.Condition(threading.Lock())
        self._ready: deque[Any] = deque()
        self._exhausted = False
        self._input_failed: Future[Any] | None = None  # unordered: given after the rest
        self._lock = threading.Lock()
        self._fill()

    def _fill(self, limit: int | None = None) -> None:
        limit = self._window if limit is None else limit
        if self._exhausted or len(self._inflight) > limit // 2:
            return
        for future in self._submit(self._read(limit - len(self._inflight))):
            self._inflight.append(future)
            if not self._ordered:  # told as it finishes: no wait over every one in flight
                future.add_done_callback(self._note)
        if self._input_failed is not None:
            self._inflight.append(self._input_failed)

    def _read(self, n: int) -> Iterator[tuple[Any, ...]]:
        """Up to ``n`` chunks of the input, as they are read (submitted as they come: see
        `FiberExecutor._submit_all`)."""
        for _ in range(n):
            try:
                chunk = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            except Exception as exc:  # the input raised: that position raises it (unordered:
                # once every result before it is given, as the stdlib's gives them)
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                self._input_failed = failed
                self._exhausted = True
                return
            yield chunk

    def _note(self, future: Future[list[Any]]) -> None:
        with self._arrived:
            self._finished.append(future)
            self._arrived.notify()

    def _drain(self) -> None:
        """Submit everything left (`Pool.join` promises every task runs)."""
        with self._lock:
            self._fill(limit=1 << 62)

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self, timeout: float | None = None) -> Any:  # (the stdlib's takes one too)
        return self.next(timeout)

    def next(self, timeout: float | None = None) -> Any:
        """The next result; `TimeoutError` if none arrives within ``timeout`` seconds."""
        with self._lock:
            while not self._ready:
                if not self._inflight:
                    raise StopIteration
                future = self._take(timeout)
                self._fill()
                success, value = _outcome(future)  # (the stdlib's imap too runs an item alone)
                if not success:
                    raise value
                if self._items:
                    self._ready.append(value)
                else:
                    self._ready.extend(value)
            return self._ready.popleft()

    def _take(self, timeout: float | None) -> Future[list[Any]]:
        if self._ordered:
            try:
                self._inflight[0].exception(timeout)
            except CancelledError:  # (its outcome says so)
                pass
            except FuturesTimeout:  # multiprocessing's, as the unordered wait raises
                raise TimeoutError from None
            return self._inflight.popleft()
        failed = self._input_failed
        last = failed is not None and len(self._inflight) == 1  # (it is in flight until given)
        with self._arrived:
            if not last and not self._arrived.wait_for(lambda: self._finished, timeout):
                raise TimeoutError
            future = self._finished.popleft() if not last else failed
        assert future is not None
        self._inflight.remove(future)
        return future


class Pool(multiprocessing.pool.Pool):
    """A pool of job-backed workers with the `multiprocessing.Pool` API.

    Args:
        processes: most workers at once (default: `cpu_count()`); `FiberExecutor`'s
            ``max_workers``.
        initializer, initargs: called in each worker before its first task.
        maxtasksperchild: replace a worker after this many tasks (chunks count as one).
        context: accepted for compatibility and ignored.
        backend: a backend name, instance or factory (default: the default backend).
        error_handling: Fiber's ``Pool`` argument, accepted: the tasks of a worker that is
            lost are always run again on another (`FiberExecutor`'s ``max_task_retries``).
        **options: any other `FiberExecutor` keyword (``image=``, ``cpu=``, ...), checked
            here, as the executor checks them.

    A function decorated with `meta` sets ``cpu``/``memory``/``gpu`` for the pool's workers
    when it is the first one submitted and the pool was not given them; a later function
    whose `meta` asks for other resources raises `RuntimeError` (as Fiber's pool did), as
    does one with a `meta` after the workers started without one (`start_workers`).

    Example:
        >>> with Pool(2) as pool:  # doctest: +SKIP
        ...     pool.map(abs, [-1, -2])
        [1, 2]
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., object] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
        context: object = None,
        *,
        backend: BackendLike | None = None,
        error_handling: bool = False,
        **options: Any,
    ) -> None:
        if processes is not None and not isinstance(processes, int):  # (the stdlib's: a
            # TypeError for "2" and for 2.0)
            raise TypeError(f"processes must be a whole number >= 1, got {processes!r}")
        if processes is not None and processes < 1:
            raise ValueError(f"Number of processes must be at least 1, got {processes!r}")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError(
                f"maxtasksperchild must be a positive int or None, got {maxtasksperchild!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        from fiberexec.multiprocessing._meta import cpu_count

        self._processes = processes or cpu_count()
        self._options: dict[str, Any] = dict(
            options, initializer=initializer, initargs=tuple(initargs),
            max_tasks_per_child=maxtasksperchild,
        )
        _check_options(self._processes, options, self._options, backend)
        self._backend_choice = backend
        self._state = RUN
        self._lock = threading.Lock()
        self._executor: FiberExecutor | None = None
        # the resources its workers started with, from a function's `meta` (None: none);
        # unused when the pool was given them (then no function's `meta` counts)
        self._meta: Meta | None = None
        self._backend: Backend | None = None
        self._owns_backend = False
        self._iterators: weakref.WeakSet[IMapIterator] = weakref.WeakSet()
        if initializer is not None:  # as the stdlib's: it runs even if no task comes
            self.start_workers()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} state={self._state} pool_size={self._processes}>"

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) == RUN:  # as the stdlib's (the workers stop anyway)
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning,
                  source=self)

    # ------------------------------------------------------------ the executor

    def workers(self) -> list[WorkerInfo]:
        """Each worker's state and the task it runs (see `FiberExecutor.workers`); an
        empty list before the first task started the pool's executor."""
        with self._lock:
            executor = self._executor
        return [] if executor is None else executor.workers()

    def _get_executor(self, fn: Callable[..., Any] | None) -> FiberExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = self._make_executor(fn)
            elif (hint := meta_of(fn)) is not None and hint != self._meta and not (
                    _RESOURCES & self._options.keys()):
                raise RuntimeError(
                    f"{getattr(fn, '__qualname__', fn)} needs {_described(hint)} (its meta), "
                    f"but this pool's workers started with {_described(self._meta)}: a pool's "
                    "workers have one set of resources, taken from the first function it "
                    "runs unless the pool is given them (cpu=, memory=, gpu=); make a pool "
                    "of its own for this function")
            return self._executor

    def _make_executor(self, fn: Callable[..., Any] | None) -> FiberExecutor:
        options = dict(self._options)
        hint = meta_of(fn)
        if hint is not None and not _RESOURCES & options.keys():
            options.update(cpu=hint.cpu, memory=hint.memory, gpu=hint.gpu)
            self._meta = hint
        choice = self._backend_choice
        inner = new_backend(choice, options.pop("backend_options", None))
        self._backend, self._owns_backend = inner, not isinstance(choice, Backend)
        # its workers say they are the pool's (`_process._pool_worker`)
        options["env"] = {**(options.get("env") or {}), ENV_POOL_PARENT: (
            f"{os.getpid()} {current_process().name}")}
        executor = FiberExecutor(self._processes, backend=inner, **options)
        # At interpreter exit the stdlib's pool is terminated (its workers are daemons), not
        # waited for: a script that ends, or is interrupted, without closing it stops now.
        executor._terminate_at_exit = True
        note_unenforced(inner, Resources(options.get("cpu"), parse_memory(options.get("memory")),
                                         options.get("gpu") or 0))
        weakref.finalize(self, _finalize, executor, inner if self._owns_backend else None)
        return executor

    def start_workers(self) -> None:
        """Start the pool's workers now rather than with its first task (Fiber's method;
        a pool given an initializer starts them at once, as the stdlib's does). They start
        with the pool's own resources: a function decorated with `meta` submitted later
        raises `RuntimeError`, as in Fiber."""
        self._check_running()
        self._get_executor(None)._start_workers()

    def wait_until_workers_up(self, timeout: float | None = None) -> None:
        """Start the pool's workers, and return once all of them are connected and ready
        for tasks (Fiber's method). `TimeoutError` after ``timeout`` seconds (None: no
        limit); the executor's error if the workers cannot be started."""
        self._check_running()
        executor = self._get_executor(None)
        count = executor._config.min_workers
        if not executor._wait_for_workers(count, timeout):
            raise TimeoutError(
                f"{executor.stats().workers} of the pool's {count} workers were up after "
                f"{timeout}s")

    def _check_running(self) -> None:
        if self._state != RUN:
            raise ValueError("Pool not running")

    def _submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._get_executor(args[0] if fn in (_mapstar, _starmapstar) else fn).submit(
            fn, *args, **kwargs)

    # ------------------------------------------------------------ apply

    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: Mapping[str, Any] | None = None) -> Any:
        """Call ``func(*args, **kwds)`` in a worker and return its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: Mapping[str, Any] | None = None, callback: Callback = None,
                    error_callback: Callback = None) -> ApplyResult:
        """Like `apply`, returning an `AsyncResult`; callbacks get the value or the error."""
        self._check_running()
        result = ApplyResult(callback, error_callback)
        result._watch((self._submit(func, *args, **(kwds or {})),))
        return result

    # ------------------------------------------------------------ map

    def _default_chunksize(self, n: int) -> int:
        chunksize, extra = divmod(n, self._processes * 4)
        return chunksize + 1 if extra else chunksize

    def _map_async(  # noqa: PLR0917  # positional like the public map_async it backs
        self, star: Callable[..., Any], func: Callable[..., Any], iterable: Iterable[Any],
        chunksize: int | None, callback: Callback, error_callback: Callback,
    ) -> MapResult:
        self._check_running()
        items = iterable if isinstance(iterable, list | tuple | range) else list(iterable)
        if chunksize is None:
            chunksize = self._default_chunksize(len(items)) or 1
        elif chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        executor = self._get_executor(func)
        if chunksize == 1:  # each item a task of its own: ``func`` travels once a message,
            # and the item alone is pickled, as a plain call's arguments are
            calls = [(item,) for item in items] if star is _mapstar else [
                tuple(args) for args in cast("Iterable[Iterable[Any]]", items)]
            result = MapResult(len(calls), callback, error_callback, items=True)
            futures = executor._submit_all(func, calls)
        else:
            chunks = list(_chunks(items, chunksize))
            result = MapResult(len(chunks), callback, error_callback)
            # all at once: each worker gets its share of the chunks in one message
            futures = executor._submit_all(star, [(func, c) for c in chunks])
        result._watch(futures)
        return result

    def map(self, func: Callable[..., Any], iterable: Iterable[Any],
            chunksize: int | None = None) -> list[Any]:
        """``list(map(func, iterable))`` in parallel, in chunks of ``chunksize`` items."""
        values: list[Any] = self._map_async(_mapstar, func, iterable, chunksize, None,
                                            None).get()
        return values

    def map_async(self, func: Callable[..., Any], iterable: Iterable[Any],
                  chunksize: int | None = None, callback: Callback = None,
                  error_callback: Callback = None) -> MapResult:
        return self._map_async(_mapstar, func, iterable, chunksize, callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[Any]:
        """Like `map`, calling ``func(*args)`` for each ``args`` in ``iterable``."""
        values: list[Any] = self._map_async(_starmapstar, func, iterable, chunksize, None,
                                            None).get()
        return values

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None, callback: Callback = None,
                      error_callback: Callback = None) -> MapResult:
        return self._map_async(_starmapstar, func, iterable, chunksize, callback,
                               error_callback)

    def _imap(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None,
              ordered: bool, buffersize: int | None) -> IMapIterator | Iterator[Any]:
        self._check_running()
        if not isinstance(chunksize, int):  # (None, "2": the stdlib's TypeError too)
            raise TypeError(f"chunksize must be a whole number >= 1, got {chunksize!r}")
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        if buffersize is not None and not isinstance(buffersize, int):
            raise TypeError("buffersize must be an integer or None")
        if buffersize is not None and buffersize < 1:
            raise ValueError("buffersize must be None or > 0")
        window = buffersize or max(IMAP_AHEAD, 2 * self._processes)
        executor = self._get_executor(func)
        snapshot = Snapshot()  # ``func`` as the call found it, for every part (as `map`)
        if chunksize == 1:  # each item a task of its own (see `_map_async`)
            iterator = IMapIterator(
                functools.partial(executor._submit_all, func, snapshot=snapshot),
                _chunks(iterable, 1), window, ordered, items=True)
        else:
            iterator = IMapIterator(
                lambda chunks: executor._submit_all(_mapstar, ((func, c) for c in chunks),
                                                    snapshot),
                _chunks(iterable, chunksize), window, ordered)
        self._iterators.add(iterator)
        return iterator if chunksize == 1 else _generator(iterator)

    def imap(self, func: Callable[..., Any], iterable: Iterable[Any],  # type: ignore[override]
             chunksize: int | None = 1, buffersize: int | None = None
             ) -> IMapIterator | Iterator[Any]:
        """Lazy `map`: results in order; the input is read only as results are consumed.

        ``buffersize`` (Python 3.14's argument) is how many tasks (chunks) run ahead of the
        results consumed; by default twice the number of workers.
        """
        return self._imap(func, iterable, chunksize, ordered=True, buffersize=buffersize)

    def imap_unordered(self, func: Callable[..., Any],  # type: ignore[override]
                       iterable: Iterable[Any],
                       chunksize: int | None = 1, buffersize: int | None = None
                       ) -> IMapIterator | Iterator[Any]:
        """Like `imap`, yielding results as they finish."""
        return self._imap(func, iterable, chunksize, ordered=False, buffersize=buffersize)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Accept no more work; what was submitted still runs."""
        if self._state == RUN:
            self._state = CLOSE

    def terminate(self) -> None:
        """Stop the workers now; results not finished raise instead of arriving."""
        self._state = TERMINATE
        with self._lock:
            executor, backend = self._executor, self._backend
        if executor is not None:
            executor.terminate()  # running tasks are killed with their workers
        if backend is not None and self._owns_backend:
            backend.close()

    def join(self) -> None:
        """Wait for the workers to finish; call `close` or `terminate` first."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        if self._state != TERMINATE:  # (terminated: what was not submitted never runs)
            for iterator in list(self._iterators):
                iterator._drain()
        with self._lock:
            executor, backend = self._executor, self._backend
        if executor is not None:
            executor.shutdown(wait=True)
        if backend is not None and self._owns_backend:
            backend.close()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()


def _finalize(executor: FiberExecutor, backend: Backend | None) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    if backend is not None:
        backend.close()
