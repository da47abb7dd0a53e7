"""A task on its way through the pool, and how its outcome reaches its future."""

from __future__ import annotations

import functools
import operator
import re
import reprlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fiberexec import _protocol as p
from fiberexec._chunks import map_chunk, starmap_chunk
from fiberexec._errors import SerializationError
from fiberexec._future import TaskFuture
from fiberexec._serialize import Snapshot, loads, loads_exception

if TYPE_CHECKING:
    from fiberexec._crash import Loss


@dataclass(eq=False, slots=True)
class WorkItem:
    task_id: int
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    started: bool = False  # set_running_or_notify_cancel() said it may run
    dropped: bool = False  # ...said it was cancelled
    losses: int = 0  # workers that died while this task was running on them
    causes: tuple[Loss, ...] = ()  # how those workers ended, as each became known
    shm_names: list[str] | tuple[()] = ()
    cost: float = 0.0  # what Conn.hold counted when it was sent
    key: str = ""  # function_key(fn), once it was sent
    number: int = -1  # its place among the tasks sent to its worker (`fiberexec._claims`)
    snapshot: Snapshot | None = None  # its ``map`` call's functions, as first pickled
    shown: tuple[str, str] | None = None  # `describe_call`'s answer, once asked

    @property
    def items(self) -> int:
        """How many of the user's items it carries: a chunk of a chunked map, or one."""
        if self.fn in _CHUNK_RUNNERS and len(self.args) == 2:
            return len(self.args[1])
        return 1

    def start(self) -> bool:
        """Mark running before the first dispatch; False if the user cancelled it (its
        waiters, `wait` and `as_completed`, are told then). Asking again is allowed: a
        cancelled task's waiters are told once."""
        if self.started:
            return True
        if self.dropped:
            return False
        self.started = self.future.set_running_or_notify_cancel()
        self.dropped = not self.started
        return self.started

    def requeued(self) -> None:
        """It is back in the executor's queue (given back, or its worker left or was lost):
        no worker holds it, and a `cancel` cancels it as any queued task."""
        if isinstance(self.future, TaskFuture):
            self.future.release()


_CHUNK_RUNNERS = (map_chunk, starmap_chunk)
_OK = p.Status.OK  # (an enum's member costs a lookup through its class at each use)


def name_task(exc: BaseException, item: WorkItem) -> BaseException:
    """``exc``, its message ending with the task it is about (named only when it fails:
    a repr of the arguments can cost more than running the task)."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} (the task: {describe(item)})", *exc.args[1:])
    return exc


def describe(item: WorkItem) -> str:
    """A task as its user wrote it: ``module.function(short repr of the arguments)``."""
    function, arguments = describe_call(item)
    return f"{function}({arguments})"


def describe_call(item: WorkItem) -> tuple[str, str]:
    """A task's function (``module.qualname``, the user's for a map chunk or a batch) and a
    short repr of its arguments (at most 80 characters). Costly next to a tiny task: call
    it only when someone asks (a failure, a snapshot), never on the way to a worker. Kept
    on the item: snapshots taken while a long task runs describe it once."""
    if item.shown is None:
        item.shown = _described(item)
    return item.shown


def _described(item: WorkItem) -> tuple[str, str]:
    if item.fn in _CHUNK_RUNNERS and len(item.args) == 2:  # shown by its first item's call
        fn, chunk = item.args
        first = chunk[0] if chunk else ()
        args = tuple(first) if item.fn is starmap_chunk else (first,)
        items = "map item" if len(chunk) == 1 else "map items"
        note = f" [the first of a chunk of {len(chunk)} {items}]"
        return function_key(fn), _shown(args, {}, note)
    fn, args, kwargs, calls = _the_call(item)
    note = f" [the first of a batch of {calls} calls]" if calls > 1 else ""
    return function_key(fn), _shown(args, kwargs, note)


def _shown(args: tuple[Any, ...], kwargs: dict[str, Any], note: str) -> str:
    parts = list(map(_short_repr.repr, args))
    if kwargs:
        parts.extend(f"{k}={_short_repr.repr(v)}" for k, v in kwargs.items())
    shown = ", ".join(parts)
    if len(shown) + len(note) > 80:
        shown = shown[:77 - len(note)] + "..."
    return shown + note


def _the_call(item: WorkItem) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], int]:
    """The call a task makes as its user wrote it, and how many it makes: through
    `operator.call` and `functools.partial`; a batch of calls (a callable whose ``items``
    are ``(function, args, kwargs)`` triples, as joblib's batches are) by its first."""
    fn, args, kwargs, calls = item.fn, item.args, item.kwargs, 1
    if fn is operator.call and args and callable(args[0]):
        fn, args = args[0], args[1:]
    batch = getattr(fn, "items", None)
    if type(batch) is list and batch and type(batch[0]) is tuple and len(batch[0]) == 3:
        (fn, args, kwargs), calls = batch[0], len(batch)
    if isinstance(fn, functools.partial):
        partial: functools.partial[Any] = fn
        fn, args, kwargs = partial.func, (*partial.args, *args), {**partial.keywords, **kwargs}
    return fn, tuple(args), dict(kwargs), calls


def span_function(item: WorkItem) -> str:
    """The function a finished task is shown under (its key, or the user's for a chunk or
    a batch)."""
    if item.fn in _CHUNK_RUNNERS and len(item.args) == 2:
        return function_key(item.args[0])
    if item.fn is operator.call:
        return function_key(_the_call(item)[0])
    return item.key or function_key(item.fn)


_ADDRESS = re.compile(r"(?: object)? at 0x[0-9a-fA-F]+>$")
_PACKAGE = re.compile(r"^<\w+\.(?=\w+\.)|^<\w+\.(?=\w+[ >])")


class _ShortRepr(reprlib.Repr):
    """reprlib's, but an object's ``<...>`` repr keeps what tells it apart: its class.
    ``<unlocked _thread.lock object at 0x7f..>`` reads ``<unlocked _thread.lock>``, and a
    long ``<pkg.module.Class ...>`` drops its leading packages before its end is cut
    (reprlib cuts the middle: ``<pkg.modu...x7f12>``)."""

    def repr_instance(self, obj: Any, level: int) -> str:
        try:
            text = repr(obj)
        except Exception:
            return super().repr_instance(obj, level)
        if not text.startswith("<"):
            return super().repr_instance(obj, level)
        text = _ADDRESS.sub(">", text)
        while len(text) > self.maxother and (shorter := _PACKAGE.sub("<", text)) != text:
            text = shorter
        if len(text) > self.maxother:
            text = text[:self.maxother - 4] + "...>"
        return text


_short_repr = _ShortRepr()
_short_repr.maxstring = _short_repr.maxother = 24
_short_repr.maxlist = _short_repr.maxtuple = _short_repr.maxdict = 4


def function_key(fn: Callable[..., Any]) -> str:
    """What run-time estimates are kept by: the function's (or its partial's) name."""
    inner = getattr(fn, "func", fn)
    name = getattr(inner, "__qualname__", None) or type(inner).__qualname__
    return f"{getattr(inner, '__module__', '')}.{name}"


def settle(item: WorkItem, result: p.Result) -> bool:
    """Give ``item``'s future the outcome in ``result``; True if the task succeeded."""
    future = item.future
    if result.status is _OK:
        try:
            value = loads(result.payload, what="result")
        except SerializationError as exc:
            future.set_exception(name_task(exc, item))
            return False
        future.set_result(value)
        return True
    try:
        future.set_exception(loads_exception(result.payload))
    except SerializationError as exc:
        future.set_exception(name_task(exc, item))
    return False
