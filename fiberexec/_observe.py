"""What an executor can tell about its workers: who runs what, where, and how it went.

    shard thread (owner)                          any thread: FiberExecutor.workers() ...
      Conn: host, pid, done, failed, usage  ---->  read without a lock, built into
      spans: deque of tuples (bounded)       ---->  frozen values on the caller's thread
      durations: counts per bucket (all)     ---->
      failures: deque of (item, exc) (bounded) -->  (arguments described only then)
      gone: deque of Conn (bounded)          ---->

The shard's thread only records, as plain attributes and tuples appended to bounded deques;
everything shown to the user (`WorkerInfo`, `TaskSpan`, `FailureInfo`) is built here, on the
thread that asks, from what it finds. Reads are of single attributes and of copies made in one
step (``list(deque)``), which the interpreter makes atomic: a snapshot may be a moment old,
never torn, and no lock sits between a submit and its dispatch.
"""

from __future__ import annotations

import heapq
import math
import operator
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from fiberexec._conn import Conn, State
from fiberexec._crash import phrase_of
from fiberexec._serialize import RemoteTraceback
from fiberexec._stats import rounded_repr
from fiberexec._task import WorkItem, describe_call

if TYPE_CHECKING:
    from fiberexec._backend import WorkerHandle
    from fiberexec._shard import Shard

SPANS_MAX = 10_000  # finished tasks remembered per shard, for task_spans()
FAILURES_MAX = 100  # failed tasks remembered per shard, for failures()
GONE_MAX = 256  # workers that left or were lost, remembered for workers()
GONE = ("lost", "retired")  # the states of a worker that is gone (or going)

# Upper bounds, in seconds, of the task duration histogram's buckets (as Prometheus' ``le``):
# from a no-op's microseconds to an RL rollout's minutes; the last is unbounded.
DURATION_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, 300.0, math.inf)

# A finished task as the shard records it: (task_id, worker_id, function, started, ended, ok),
# times on the shard's clock.
SpanRecord = tuple[int, str, str, float, float, bool]
# A failed task: (item, worker_id or None, exception, when on the shard's clock).
# (and the exception's traceback then: raising it again, `result()` puts its caller's frames
# in front of its ``__traceback__``)
FailureRecord = tuple[WorkItem, "str | None", BaseException, float, "TracebackType | None"]

V = TypeVar("V")


@dataclass(frozen=True, slots=True, repr=False)
class TaskInfo:
    """A task running on a worker.

    Attributes:
        task_id: the executor's number for the task (in submission order).
        function: the qualified name of the function, as ``module.qualname``; for a chunk
            of a chunked ``map``, the user's function.
        arguments: a short repr of the arguments (at most about 80 characters).
        started: `time.time` when the worker began it (when it was sent, if that is all
            the executor knows).
    """

    task_id: int
    function: str
    arguments: str
    started: float

    __repr__ = rounded_repr


@dataclass(frozen=True, slots=True, repr=False)
class WorkerInfo:
    """One worker, as `FiberExecutor.workers` sees it.

    Attributes:
        worker_id: the executor's name for it (``"w12"``), as in logs and errors.
        backend: the backend's name (``"local"``, ``"docker"``, ...).
        reference: the backend's handle: a pid, container id, pod or job name.
        host: the host name the worker reported ("" before it connected).
        state: ``"starting"`` (not connected, or in its initializer), ``"idle"``,
            ``"running"``, ``"lost"`` (died or cut off) or ``"retired"`` (left in order).
        task: the task it is running, or None.
        tasks_done: tasks it finished with a result (a map's items, as `stats` counts them,
            not the chunks that carried them).
        tasks_failed: tasks it finished with an exception, or was running when it was lost.
        cpu_percent: its process's CPU use since its last report (100 is one core), or
            None before its first report and once it is lost or retired.
        rss_bytes: its resident memory at its last report, or None (as ``cpu_percent``).
        last_heard: `time.time` of the last message from it, or None.
        ended: how a lost worker ended (``"was killed by signal 9 (SIGKILL)"``, ``"exited
            with code 3"``, ``"lost its connection"`` until its exit status is known), or
            why a retired one left (``"idle for 60.0s"``, ``"max_tasks_per_child
            reached"``, ``"the executor shut down"``);
            None while it lives.
        executor_id: its executor's `FiberExecutor.executor_id` (worker ids are the
            executor's own: ``w0`` of one executor is not ``w0`` of another).
    """

    worker_id: str
    backend: str
    reference: str
    host: str
    state: str
    task: TaskInfo | None
    tasks_done: int
    tasks_failed: int
    cpu_percent: float | None
    rss_bytes: int | None
    last_heard: float | None
    ended: str | None = None
    executor_id: str = ""

    __repr__ = rounded_repr


@dataclass(frozen=True, slots=True, repr=False)
class TaskSpan:
    """A finished task, for a task-stream view: where it ran, from when to when.

    ``started`` and ``ended`` are `time.time` values: ``ended`` when its result reached the
    executor, ``started`` that less the run time the worker measured.
    """

    task_id: int
    worker_id: str
    function: str
    started: float
    ended: float
    ok: bool

    __repr__ = rounded_repr


@dataclass(frozen=True, slots=True, repr=False)
class Durations:
    """How long the tasks finished so far ran on their workers, every one of them counted
    once, as a histogram (the shape of Prometheus' ``fiberexec_task_duration_seconds``).

    Attributes:
        bounds: each bucket's upper bound in seconds, rising; the last is ``math.inf``.
        counts: tasks per bucket (not cumulative): ``counts[i]`` ran longer than
            ``bounds[i - 1]`` and at most ``bounds[i]``.
        total: their run times summed, in seconds.
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    __repr__ = rounded_repr

    @property
    def count(self) -> int:
        """Tasks counted: each whose worker sent back its outcome (a result or an
        exception); a task lost with its worker ran for no known time and is not counted."""
        return sum(self.counts)


@dataclass(frozen=True, slots=True, repr=False)
class FailureInfo:
    """A task that failed: what it was, where it ran, and the error.

    Attributes:
        task_id: the executor's number for the task.
        worker_id: the worker it failed on; None if it never reached one (its arguments
            could not be pickled, say).
        function: the qualified name of its function.
        arguments: a short repr of its arguments.
        error: the exception, on one line (``ValueError: bad input``).
        traceback: the traceback text; the worker's, for an exception raised there.
        when: `time.time` when the executor learned of it.
    """

    task_id: int
    worker_id: str | None
    function: str
    arguments: str
    error: str
    traceback: str
    when: float

    __repr__ = rounded_repr


# ---------------------------------------------------------------------------- snapshots


def _builder(cls: type[V]) -> Callable[..., V]:
    """Build ``cls`` from its fields' values, in order, without the frozen ``__init__``'s
    per-field ``object.__setattr__``: one call of each field's slot setter, written out
    (a loop over them costs 1.7 times as much): snapshots build thousands."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update((f"set_{i}", getattr(cls, name).__set__) for i, name in enumerate(names))
    values = ", ".join(f"v{i}" for i in range(len(names)))
    sets = "".join(f"    set_{i}(obj, v{i})\n" for i in range(len(names)))
    exec(f"def build({values}):\n    obj = new(cls)\n{sets}    return obj\n", scope)
    build: Callable[..., V] = scope["build"]
    return build


_worker = _builder(WorkerInfo)
_ORDER = operator.attrgetter("order")  # how workers are listed: w2 before w10
_task = _builder(TaskInfo)
_span = _builder(TaskSpan)


def worker_infos(
    shards: Sequence[Shard], starting: Mapping[str, WorkerHandle | None], backend: str,
    executor_id: str,
) -> list[WorkerInfo]:
    """Every worker the shards serve (by id: w2 before w10), those being started, then
    those recently gone."""
    # Each shard's workers sorted by a key read in C, then merged (one shard: as they are).
    ordered = [sorted(shard.conns.values(), key=_ORDER) for shard in shards]
    offsets = [shard.wall_offset for shard in shards]
    if len(ordered) == 1:
        infos = [_worker_info(conn, backend, offsets[0], executor_id) for conn in ordered[0]]
    else:
        tagged = [[(conn.order, i, conn) for conn in conns] for i, conns in enumerate(ordered)]
        infos = [_worker_info(conn, backend, offsets[i], executor_id)
                 for _, i, conn in heapq.merge(*tagged)]
    seen = {info.worker_id for info in infos}
    gone = [(conn, shard.wall_offset) for shard in shards for conn in list(shard.gone)
            if conn.worker_id not in seen]
    gone.sort(key=lambda pair: pair[0].ended or 0.0)
    gone = gone[-GONE_MAX:]
    seen.update(conn.worker_id for conn, _ in gone)  # the supervisor may not know yet
    for worker_id, handle in starting.items():
        if worker_id not in seen:
            infos.append(WorkerInfo(worker_id, backend, handle.ref if handle else "", "",
                                    "starting", None, 0, 0, None, None, None, None,
                                    executor_id))
    infos.extend(_worker_info(conn, backend, offset, executor_id) for conn, offset in gone)
    return infos


# What a serving worker's connection state shows as (unless it runs a task). One dict
# lookup a worker: a snapshot makes thousands, and each read of an enum's member through its
# class costs about 70 ns.
_SERVING = {State.READY: "idle", State.RETIRING: "retired"}
_STARTING = State.AWAIT_HELLO


def _worker_info(conn: Conn, backend: str, offset: float, executor_id: str) -> WorkerInfo:
    task = _running_task(conn, offset) if conn.inflight and not conn.initializing else None
    serving = _SERVING.get(conn.state)
    if serving is None:
        state = "starting" if conn.state is _STARTING else "lost" if conn.lost else "retired"
    elif conn.initializing:  # what it was sent waits for the initializer
        state = "starting"
    else:
        state = "running" if task is not None else serving
    handle = conn.handle
    reference = handle.ref if handle is not None else (f"{conn.host}:{conn.pid}"
                                                        if conn.pid else "")
    heard = conn.last_recv + offset if conn.host else None
    if state in GONE:  # its last readings are not what it uses now
        return _worker(conn.worker_id, backend, reference, conn.host, state, task,
                       conn.tasks_done, conn.tasks_failed, None, None, heard,
                       _ended(conn, state), executor_id)
    cpu = conn.cpu_percent
    return _worker(conn.worker_id, backend, reference, conn.host, state, task,
                   conn.tasks_done, conn.tasks_failed, cpu if cpu >= 0 else None,
                   conn.rss_bytes or None, heard, None, executor_id)


def _ended(conn: Conn, state: str) -> str:
    """How a gone (or going) worker ended: what happened to a lost one, why a retired one
    left."""
    if state == "lost":
        return phrase_of(conn.why or conn.describe_exit(), conn.worker_id)
    return conn.leaving or "left"


def _running_task(conn: Conn, offset: float) -> TaskInfo | None:
    try:
        item = next(iter(conn.inflight.values()), None)
    except RuntimeError:  # changed under us by the shard's thread: a moment later, it runs
        return None
    if item is None:
        return None
    function, arguments = describe_call(item)
    return _task(item.task_id, function, arguments, conn.head_since + offset)


def task_spans(shards: Iterable[Shard], since: float,
               limit: int | None = None) -> list[TaskSpan]:
    # Records are built only for the spans returned: a page asks for the newest few
    # thousand of up to 10,000 per shard, and a record costs more than its raw tuple. A
    # shard keeps its spans in the order they ended, so the newest ``limit`` of all are
    # among each shard's newest ``limit``: only those are looked at.
    raw: list[tuple[float, float, int, str, str, bool]] = []
    for shard in shards:
        offset = shard.wall_offset
        kept = list(shard.spans)  # a copy: the shard's thread appends meanwhile
        if limit is not None:
            kept = kept[len(kept) - min(len(kept), max(0, limit)):]
        raw.extend((end + offset, start + offset, task_id, worker_id, function, ok)
                   for task_id, worker_id, function, start, end, ok in kept
                   if end + offset >= since)
    raw.sort(key=lambda r: r[0])
    if limit is not None:
        raw = raw[max(0, len(raw) - max(0, limit)):]
    return [_span(task_id, worker_id, function, start, end, ok)
            for end, start, task_id, worker_id, function, ok in raw]


def span_summary(shards: Iterable[Shard], window: float) -> tuple[dict[str, float], float]:
    """The median run time of each function over the spans kept (and of every task, under
    ``"*"``, which is no function's name), and tasks finished per second over the last
    ``window`` seconds."""
    durations: dict[str, list[float]] = {}
    every: list[float] = []
    recent = 0
    for shard in shards:
        since = shard.clock() - window
        for _, _, function, start, end, _ in list(shard.spans):
            durations.setdefault(function, []).append(end - start)
            every.append(end - start)
            recent += end >= since
    medians = {f: sorted(d)[len(d) // 2] for f, d in durations.items()}
    if every:
        medians["*"] = sorted(every)[len(every) // 2]
    return medians, recent / window


def durations(shards: Iterable[Shard]) -> Durations:
    """Every shard's tally of run times, summed."""
    counts = [0] * len(DURATION_BOUNDS)
    total = 0.0
    for shard in shards:
        # A copy in one step; a task may be counted in a bucket and not yet in the total (a
        # moment apart), as a scrape may see any counter a moment old.
        for i, n in enumerate(list(shard.duration_counts)):
            counts[i] += n
        total += shard.duration_total
    return Durations(DURATION_BOUNDS, tuple(counts), total)


def failures(shards: Iterable[Shard], limit: int) -> list[FailureInfo]:
    records: list[tuple[float, WorkItem, str | None, BaseException, TracebackType | None]] = []
    for shard in shards:
        offset = shard.wall_offset
        records.extend((when + offset, item, worker_id, exc, tb)
                       for item, worker_id, exc, when, tb in list(shard.failures))
    records.sort(key=lambda record: record[0])
    return [_failure(*record) for record in records[-limit:]] if limit > 0 else []


def _failure(when: float, item: WorkItem, worker_id: str | None, exc: BaseException,
             tb: TracebackType | None) -> FailureInfo:
    function, arguments = describe_call(item)
    lines = str(exc).strip().splitlines()
    error = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):
        text = str(cause.tb).strip("\n").strip('"').strip("\n")
    else:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    return FailureInfo(item.task_id, worker_id, function, arguments, error, text, when)


# ---------------------------------------------------------------------------- stack dumps


def connected(shard: Shard, worker_id: str) -> bool:
    """Whether ``shard`` serves ``worker_id`` and can still ask it something."""
    conn = shard.conns.get(worker_id)
    return (conn is not None and conn.state in (State.READY, State.RETIRING)
            and shard.thread.is_alive())


def not_serving(worker_id: str, workers: Sequence[WorkerInfo]) -> str:
    """Why a stack dump cannot be asked of ``worker_id``, and which workers could."""
    for info in workers:
        if info.worker_id == worker_id:
            return (f"worker {worker_id} is {info.state}: only a connected worker can send "
                    f"its stack")
    live = [w.worker_id for w in workers if w.state in ("idle", "running")]
    return (f"no worker {worker_id!r} in this executor; connected workers: "
            f"{', '.join(live[:20]) or 'none'}{' ...' if len(live) > 20 else ''}")


def fail_stack_requests(requests: dict[int, Future[str]], why: str) -> None:
    """The worker is gone: nobody answers these."""
    for future in requests.values():
        if not future.done():
            future.set_exception(LookupError(why))
    requests.clear()


def note_gone(gone: deque[Conn], conn: Conn, now: float) -> None:
    """Remember a worker that left (its record outlives it in workers()), without what it
    no longer needs: the peer's pipe holds a read buffer as large as the largest message
    it sent (up to 512 KiB), and 256 records of workers replaced for `max_tasks_per_child`
    held 98 MiB of them."""
    if conn.ended is None:
        conn.ended = now
        conn.pipe = conn.cache = None
        gone.append(conn)
