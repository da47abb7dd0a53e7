"""A shard driven step by step: a fake clock, fake channels, a recording lifecycle, no process.

The test plays each worker: it speaks the real protocol (handshake, results, goodbyes) into a
`FakeLink`, calls `Shard.step(0)`, and reads what the shard sent back.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, as_completed
from concurrent.futures import wait as futures_wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest

from fiberexec import _auth, _future, _shm
from fiberexec import _events as ev
from fiberexec import _protocol as p
from fiberexec import _shard as shard_module
from fiberexec._backend import WorkerHandle, WorkerState, WorkerStatus
from fiberexec._claims import ClaimBoard
from fiberexec._config import ExecutorConfig
from fiberexec._conn import WINDOW_TIME, State
from fiberexec._errors import ProtocolError, WorkerLostError
from fiberexec._future import TaskFuture
from fiberexec._serialize import dumps, dumps_exception
from fiberexec._session import Session
from fiberexec._shard import STATUS_WAIT, Shard
from fiberexec._task import WorkItem
from tests.support.clock import FakeClock

T = TypeVar("T")
SHORT = 2.0**-12  # seconds: a known short task (exact in binary, so window sums are exact)


@dataclass
class FakePipe:
    id: int
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class Received:
    bytes: bytes
    pipe: FakePipe


class FakeLink:
    """A worker's channel whose far end is the test. Readable exactly while frames wait."""

    def __init__(self, capacity: int = 1024) -> None:
        self.closed = False
        self.sealed = False
        self.bound: FakePipe | None = None
        self.capacity = capacity
        self.sent: list[bytes] = []
        self._inbox: deque[Received] = deque()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self._fd

    def deliver(self, message: p.Message, pipe: FakePipe) -> None:
        self._inbox.append(Received(p.encode(message), pipe))
        os.eventfd_write(self._fd, 1)

    def try_recv(self) -> Received | None:
        if self._inbox:
            return self._inbox.popleft()
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass
        return None

    def bind(self, pipe: FakePipe) -> None:
        self.bound = pipe

    def seal(self) -> None:
        self.sealed = True

    def send_nowait(self, frame: bytes) -> None:
        if len(self.sent) >= self.capacity:
            raise ProtocolError("peer is not reading: its send queue is full")
        self.sent.append(frame)

    def take_in(self) -> None:
        """(Frames wait in the inbox: nothing to read.)"""

    @property
    def peer_gone(self) -> bool:
        return False  # the test is its far end, and reads everything

    cpu: float | None = None  # the peer's CPU time, as a local socket's kernel would say

    def peer_cpu(self) -> float | None:
        return self.cpu

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._fd)

    def take(self) -> list[Any]:
        """What the shard sent since the last call, decoded."""
        messages = [p.decode(frame) for frame in self.sent]
        self.sent.clear()
        return messages


@dataclass
class Recorder:
    """The shard's `Lifecycle`, recording every call."""

    retire: bool = True
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)

    def worker_ready(self, worker_id: str) -> None:
        self.ready.add(worker_id)
        self.calls.append(("ready", worker_id))

    def worker_gone(self, worker_id: str, handle: WorkerHandle | None, *, replace: bool,
                    lost: bool = False, waiting: Callable[[], bool] | None = None) -> None:
        self.ready.discard(worker_id)
        self.calls.append(("gone", worker_id, replace))

    def worker_failed_to_start(self, worker_id: str, status: WorkerStatus | None) -> None:
        self.calls.append(("failed_to_start", worker_id, status))

    def may_retire(self, worker_id: str) -> bool:
        self.calls.append(("may_retire", worker_id))
        return self.retire

    def ready_count(self) -> int:
        return len(self.ready)

    def starting(self, index: int) -> int:
        return 0  # the fake starts nothing

    def break_executor(self, message: str, cause: BaseException | None) -> None:
        self.calls.append(("broken", message))

    def progress(self) -> None:
        pass

    def output(self, worker_id: str, host: str, stdout: bytes, stderr: bytes) -> None:
        self.calls.append(("output", worker_id, host, stdout, stderr))

    def named(self, kind: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == kind]


class Bench:
    """One or more shards under test, their clock, lifecycle and the workers the test plays."""

    def __init__(self, shards: int = 1, *, shm: bool = False, **settings: Any) -> None:
        settings.setdefault("max_workers", 4)
        config = ExecutorConfig(min_workers=0, backend="local", **settings)
        self.session = Session(config, "test", _auth.new_secret(), shm=shm)
        self.clock = FakeClock()
        self.life = Recorder()
        self.shards = [Shard(self.session, i, self.life, clock=self.clock)
                       for i in range(shards)]
        for shard in self.shards:
            shard.peers = self.shards
        self._resources = ExitStack()  # what a test opened beside the shards
        self.links: dict[str, FakeLink] = {}
        self.pipes: dict[str, FakePipe] = {}
        self._task_ids = 0

    @property
    def shard(self) -> Shard:
        return self.shards[0]

    def step(self, rounds: int = 2) -> None:
        for _ in range(rounds):
            for shard in self.shards:
                shard.step(0)

    def connect(self, worker_id: str, *, shard: int = 0, rtt: float = 0.0) -> FakeLink:
        """Adopt a channel for ``worker_id`` and authenticate a worker on it."""
        link = FakeLink()
        pipe = FakePipe(len(self.pipes) + 1)
        self.links[worker_id], self.pipes[worker_id] = link, pipe
        target = self.shards[shard]
        ours = _auth.new_nonce()  # the executor's, as its start request carries it
        target.post(ev.Adopt(worker_id, link, ours))
        target.step(0)
        nonce = _auth.new_nonce()
        proof = _auth.proof(self.session.secret, "worker", nonce, ours)
        link.deliver(p.Hello(worker_id, nonce, 1, "localhost", proof, ""), pipe)
        target.step(0)
        setup = p.decode(link.sent.pop(0))  # tasks may follow it
        assert isinstance(setup, p.Setup)
        assert _auth.verify(_auth.proof(self.session.secret, "executor", nonce, ours),
                            setup.proof)
        self.clock.advance(rtt)  # its first heartbeat, sent as the Setup arrived
        link.deliver(p.Heartbeat(), pipe)
        target.step(0)
        return link

    def submit(self, fn: Any, n: int, *, shard: int = 0) -> list[WorkItem]:
        items = []
        for _ in range(n):
            self._task_ids += 1
            item = WorkItem(self._task_ids, TaskFuture(), fn, (self._task_ids,), {})
            self.shards[shard].put(item)
            items.append(item)
        return items

    def tasks_sent(self, worker_id: str) -> list[int]:
        return [t.task_id for m in self.links[worker_id].take() if isinstance(m, p.Tasks)
                for t in m.tasks]

    def answer(self, worker_id: str, task_ids: list[int], runtime: float) -> None:
        results = [p.Result(t, p.Status.OK, dumps(t), runtime) for t in task_ids]
        self.links[worker_id].deliver(p.Results(results), self.pipes[worker_id])

    def exit(self, worker_id: str, code: int = 0) -> None:
        """The backend reports that ``worker_id`` exited with ``code``."""
        self.shard.post(ev.Exited(worker_id, WorkerStatus(WorkerState.EXITED, code)))
        self.step()

    def enter(self, resource: AbstractContextManager[T]) -> T:
        """Open ``resource`` until the bench closes."""
        return self._resources.enter_context(resource)

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
        self._resources.close()


@pytest.fixture
def bench() -> Any:
    made: list[Bench] = []

    def make(shards: int = 1, **settings: Any) -> Bench:
        made.append(Bench(shards, **settings))
        return made[-1]

    yield make
    for b in made:
        b.close()


def job(x: int) -> int:
    return x


def other_job(x: int) -> int:
    return x


# ---------------------------------------------------------------- credit windows

def test_a_task_of_unknown_length_goes_only_to_a_worker_holding_nothing(bench: Any) -> None:
    b = bench()
    b.connect("w0")
    b.connect("w1")
    b.submit(job, 5)
    b.step()
    assert [len(b.tasks_sent(w)) for w in ("w0", "w1")] == [1, 1]
    assert len(b.shard.queue) == 3


def test_a_turn_serves_idle_workers_in_order_as_far_as_the_queue_reaches(bench: Any) -> None:
    """Of many idle workers, a turn serves only as many as the queue needs, those idle
    longest first, and the next turn goes on from the first it left unserved."""
    b = bench(max_workers=8)
    workers = [f"w{i}" for i in range(8)]
    for worker in workers:
        b.connect(worker)
    first = b.submit(job, 3)
    b.step()
    assert [b.tasks_sent(w) for w in workers] == [[t.task_id] for t in first] + [[]] * 5
    b.answer("w0", [first[0].task_id], runtime=SHORT)
    b.step()
    second = b.submit(job, 6)
    b.step()
    sent = {w: b.tasks_sent(w) for w in workers}
    assert [sent[w] for w in workers[3:]] == [[t.task_id] for t in second[:5]]
    assert sent["w0"] == [second[5].task_id]  # idle again, after those idle longer
    assert sent["w1"] == sent["w2"] == []  # each holds a task of unknown length


def _held_per_round(b: Bench, worker: str, rounds: int, rtt: float = 0.0) -> list[int]:
    """How many tasks ``worker`` is sent each time it answers all it holds (each answer
    ``rtt`` after the tasks' run)."""
    sent, sizes = b.tasks_sent(worker), []
    for _ in range(rounds):
        b.clock.advance(rtt + SHORT * len(sent))
        b.answer(worker, sent, runtime=SHORT)
        b.step()
        sent = b.tasks_sent(worker)
        sizes.append(len(sent))
    return sizes


def test_known_short_tasks_fill_the_time_window_after_a_slow_start(bench: Any) -> None:
    b = bench()
    b.connect("w0")
    b.submit(job, 100)
    b.step()
    first = b.shard.conns["w0"].dispatched
    sizes = _held_per_round(b, "w0", 5)
    assert sizes[0] == 2  # one result came back as estimated: one may wait behind the next
    assert sizes == sorted(sizes)  # doubling with each batch as estimated...
    assert sizes[-1] == int(WINDOW_TIME / SHORT)  # ...up to 2 ms of 244 us tasks: 8
    assert first == 1


def test_a_burst_goes_half_to_the_idle_worker_and_half_to_the_one_holding_a_task(
        bench: Any) -> None:
    """A map of 8 known short tasks, the first already at one worker: the other, idle,
    gets its share, and the first the rest. (An idle worker is hungry too, and was served
    twice in one turn: 7 of the 8 ran on it, one after another, while the other idled.)"""
    b = bench()
    b.connect("w0")
    b.submit(job, 30)
    b.step()
    _held_per_round(b, "w0", 6)  # it is known short, and trusted
    while b.shard.conns["w0"].inflight:
        b.answer("w0", list(b.shard.conns["w0"].inflight), runtime=SHORT)
        b.step()
        b.tasks_sent("w0")
    b.connect("w1")
    b.submit(job, 2)
    b.step()
    [first] = b.tasks_sent("w0")
    assert len(b.tasks_sent("w1")) == 1
    b.answer("w0", [first], runtime=SHORT)
    b.step()  # w0 idles, w1 holds a task
    b.submit(job, 7)
    b.step()
    assert [len(b.tasks_sent(w)) for w in ("w0", "w1")] == [4, 3]


def test_a_far_worker_holds_two_round_trips_more(bench: Any) -> None:
    b = bench()
    b.connect("w0", rtt=0.004)
    b.submit(job, 400)
    b.step()
    assert _held_per_round(b, "w0", 8, rtt=0.004)[-1] == int(
        (WINDOW_TIME + 2 * 0.004) / SHORT)  # 40


def test_a_slow_handshake_widens_the_window_only_until_a_task_comes_back_sooner(
        bench: Any) -> None:
    """A handshake made while the machine starts workers is slow; the link is not: the
    shortest round trip seen counts. (A wide window let one worker take six of a map's
    eight tasks while the other held two.)"""
    b = bench()
    b.connect("w0", rtt=0.004)
    b.submit(job, 400)
    b.step()
    assert _held_per_round(b, "w0", 8, rtt=0.0001)[-1] == int(
        (WINDOW_TIME + 2 * 0.0001) / SHORT)  # 9, not 40
    held = list(b.shard.conns["w0"].inflight)
    b.clock.advance(0.004 + SHORT * len(held))  # a slow answer: the shortest still counts
    b.answer("w0", held, runtime=SHORT)
    b.step()
    assert len(b.tasks_sent("w0")) == 9


def test_a_task_that_outruns_its_estimate_starts_the_slow_start_over(bench: Any) -> None:
    b = bench()
    b.connect("w0")
    b.submit(job, 100)
    b.step()
    assert _held_per_round(b, "w0", 4)[-1] == 8
    b.answer("w0", list(b.shard.conns["w0"].inflight), runtime=0.5)  # arguments made them long
    b.step()
    assert len(b.tasks_sent("w0")) == 1  # its estimate is long now: one at a time


def test_nothing_is_queued_behind_a_known_long_task(bench: Any) -> None:
    """A worker running a long task holds no other: it would wait there while another
    worker that finishes first could run it (the stdlib's workers take from one queue)."""
    b = bench()
    b.connect("w0")
    b.connect("w1")
    b.submit(job, 1)
    b.step()
    b.answer("w0", b.tasks_sent("w0"), runtime=0.5)
    b.step()
    b.submit(job, 10)
    b.step()
    assert [len(b.tasks_sent(w)) for w in ("w0", "w1")] == [1, 1]
    assert len(b.shard.queue) == 8  # for whichever worker finishes first


def test_a_task_nothing_will_wait_behind_is_sent_alone(bench: Any) -> None:
    """`Tasks.alone` tells the worker that only a stack request can come while the task
    runs (its watcher starts late): true for a task of unknown length or a long one, sent
    to a worker holding nothing; false once short tasks may be sent to wait behind."""
    b = bench()
    b.connect("w0")
    b.submit(job, 1)
    b.step()
    (first,) = [m for m in b.links["w0"].take() if isinstance(m, p.Tasks)]
    assert first.alone  # its length is unknown
    b.answer("w0", [t.task_id for t in first.tasks], runtime=0.5)
    b.step()
    b.submit(job, 3)
    b.step()
    (long,) = [m for m in b.links["w0"].take() if isinstance(m, p.Tasks)]
    assert long.alone and len(long.tasks) == 1  # known long: one at a time

    short = bench()
    short.connect("w0")
    short.submit(job, 100)
    short.step()
    (first,) = [m for m in short.links["w0"].take() if isinstance(m, p.Tasks)]
    short.answer("w0", [t.task_id for t in first.tasks], runtime=SHORT)
    short.step()
    (ahead,) = [m for m in short.links["w0"].take() if isinstance(m, p.Tasks)]
    assert len(ahead.tasks) == 2 and not ahead.alone  # known short: one waits behind


def test_estimates_are_kept_per_function(bench: Any) -> None:
    b = bench()
    b.connect("w0")
    b.submit(job, 1)
    b.step()
    b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
    b.step()
    [known] = b.submit(job, 1)
    b.submit(other_job, 3)  # unknown: not sent until w0 holds nothing
    b.step()
    assert b.tasks_sent("w0") == [known.task_id]
    assert b.shard.estimates == {f"{__name__}.job": SHORT}


# ---------------------------------------------------------------- stealing

def _woken(shard: Shard) -> bool:
    """Whether the shard's thread was woken (its wake-up counter drained)."""
    try:
        os.eventfd_read(shard._wake_fd)
    except BlockingIOError:
        return False
    return True


def test_a_task_no_worker_can_take_yet_waits_for_the_turn_a_worker_brings(bench: Any) -> None:
    """Submitted while the shard's thread sleeps and no worker could take it (none has
    connected yet, or each runs a task nothing may wait behind), a task does not wake the
    thread: the worker that connects, or frees up, wakes it, and that turn sends the task.
    With another shard that could take it away, the thread is woken."""
    b = bench()
    shard = b.shard
    shard._sleeping = True  # as its thread is, waiting in its selector
    [first] = b.submit(job, 1)
    assert not _woken(shard)
    shard._sleeping = False
    b.connect("w0")  # (its handshake's turns take in what waited)
    [second] = b.submit(job, 1)
    b.step()
    # w0 holds a task of unknown length: nothing goes behind it, so it takes no more
    assert b.tasks_sent("w0") == [first.task_id]
    shard._sleeping = True
    [third] = b.submit(job, 1)
    assert not _woken(shard)
    shard._sleeping = False
    b.answer("w0", [first.task_id], runtime=1.0)  # a long one: still nothing behind it
    b.step()
    assert b.tasks_sent("w0") == [second.task_id]
    assert [item.task_id for item in shard.queue] == [third.task_id]

    two = bench(shards=2)
    two.shard._sleeping = True
    two.submit(job, 1)
    assert _woken(two.shard)
    two.shard._sleeping = False


def test_a_shard_without_workers_hands_its_whole_queue_to_one_with_idle_workers(
    bench: Any,
) -> None:
    b = bench(shards=2)
    b.connect("w0", shard=1)
    items = b.submit(job, 20, shard=0)
    b.step(rounds=3)  # 1 asks 0, 0 answers, 1 dispatches
    assert b.shards[0].queue == deque()
    assert b.shards[1].stolen == 20
    assert b.tasks_sent("w0") == [items[0].task_id]  # in order, and one at a time (unknown)


def test_a_busy_shard_gives_half_of_a_long_queue_and_nothing_of_a_short_one(
    bench: Any,
) -> None:
    b = bench(shards=2)
    b.connect("w0", shard=0)
    b.connect("w1", shard=1)
    b.submit(job, 21, shard=0)
    b.step(rounds=3)
    assert b.shards[1].stolen == 10  # of the 20 w0 was not given
    assert len(b.shards[0].queue) == 10
    b2 = bench(shards=2)
    b2.connect("w0", shard=0)
    b2.connect("w1", shard=1)
    b2.submit(job, 5, shard=0)
    b2.step(rounds=3)
    assert b2.shards[1].stolen == 0 and len(b2.shards[0].queue) == 4


# ---------------------------------------------------------------- losing workers

def _hold_three(b: Bench) -> list[WorkItem]:
    b.connect("w0")
    first = b.submit(job, 1)
    b.step()
    b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
    b.step()
    b.submit(job, 1)  # a second short result: two may wait behind the running one now
    b.step()
    b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
    b.step()
    items = b.submit(job, 3)
    b.step()
    assert b.tasks_sent("w0") == [i.task_id for i in items]
    assert first[0].future.result(timeout=0) == first[0].task_id
    return items


def test_a_lost_worker_charges_only_the_task_it_was_running(bench: Any) -> None:
    b = bench(max_task_retries=2)
    items = _hold_three(b)
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))
    b.step()
    assert [i.losses for i in items] == [1, 0, 0]
    assert list(b.shard.queue) == items  # requeued in their order, at once
    assert b.shard.lost == 1 and b.shard.retried == 3
    b.shard.post(ev.Exited("w0", WorkerStatus(WorkerState.FAILED, -11)))
    b.step()  # replaced once its exit status says how it ended (or STATUS_WAIT passed)
    assert b.life.named("gone") == [("gone", "w0", True)]
    b.connect("w1")
    b.step()
    assert b.tasks_sent("w1") == [i.task_id for i in items]


def test_each_loss_is_logged_with_its_cause_and_the_retry(
        bench: Any, caplog: pytest.LogCaptureFixture) -> None:
    b = bench(max_task_retries=1)
    items = _hold_three(b)
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))  # the connection drops first
    b.step()
    assert not caplog.records  # how it ended is not known yet: not "lost its connection"
    b.shard.post(ev.Exited("w0", WorkerStatus(WorkerState.FAILED, -11)))
    b.step()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"worker w0 was killed by signal 11 (SIGSEGV) while running "
                    f"{__name__}.job({items[0].task_id}); retrying it on another worker "
                    f"(try 2 of 2, max_task_retries=1)")
    b.connect("w1")
    b.step()
    b.shard.post(ev.PipeDown("w1", b.pipes["w1"].id))
    b.shard.post(ev.Exited("w1", WorkerStatus(WorkerState.FAILED, 3)))
    b.step()
    assert "it was tried 2 times (max_task_retries=1) and fails" in caplog.records[-1].getMessage()
    message = str(items[0].future.exception(timeout=0))
    # each cause, the count, and the hint that fits the first loss (a signal, not an exit)
    assert ("workers that died: worker w0 was killed by signal 11 (SIGSEGV); "
            "worker w1 exited with code 3. It was tried 2 times") in message
    assert "a fault in native code" in message


def test_a_task_out_of_retries_fails_naming_how_its_worker_ended(bench: Any) -> None:
    b = bench(max_task_retries=0)
    items = _hold_three(b)
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))
    b.step()
    assert not items[0].future.done()  # waits for the exit status to say why
    b.shard.post(ev.Exited("w0", WorkerStatus(WorkerState.FAILED, -9)))
    b.step()
    with pytest.raises(WorkerLostError, match="killed by signal 9"):
        items[0].future.result(timeout=0)
    assert list(b.shard.queue) == items[1:]


def test_without_an_exit_status_the_failure_says_the_connection_was_lost(bench: Any) -> None:
    b = bench(max_task_retries=0)
    items = _hold_three(b)
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))
    b.step()
    b.clock.advance(STATUS_WAIT + 0.1)
    b.step()
    with pytest.raises(WorkerLostError, match="lost its connection"):
        items[0].future.result(timeout=0)


def test_a_worker_silent_for_the_silence_timeout_is_lost(bench: Any) -> None:
    b = bench(heartbeat=1.0, silence_timeout=20.0)
    link = b.connect("w0")
    items = b.submit(job, 1)
    b.step()
    b.tasks_sent("w0")
    for _ in range(19):  # silent for 19 s: slow, not dead
        b.clock.advance(1.0)
        b.step()
    assert any(isinstance(m, p.Heartbeat) for m in link.take())  # we speak, it does not
    assert b.shard.lost == 0 and not link.closed
    for _ in range(3):
        b.clock.advance(0.5)
        b.step()
    assert b.shard.lost == 1 and items[0].losses == 1
    assert link.closed
    assert b.life.named("gone") == [("gone", "w0", True)]


def test_a_silent_worker_whose_cpu_time_grows_is_at_work_not_lost(bench: Any) -> None:
    """Where its link names its process (a local socket), a silent worker using CPU is in
    a task holding the GIL; once it has used none for a silence (hung, stopped), it is
    lost (a starved worker gets a tick only now and then: one look is not enough)."""
    b = bench(heartbeat=1.0, silence_timeout=20.0)
    link = b.connect("w0")
    link.cpu = 1.0
    b.submit(job, 1)
    b.step()
    for _ in range(60):  # a minute of silence, computing all along
        b.clock.advance(1.0)
        link.cpu += 0.9
        b.step()
    assert b.shard.lost == 0 and not link.closed
    for _ in range(19):  # then it stops using the CPU: a silence more, it is still kept
        b.clock.advance(1.0)
        b.step()
    assert b.shard.lost == 0
    for _ in range(3):
        b.clock.advance(0.5)
        b.step()
    assert b.shard.lost == 1 and link.closed


def test_a_held_up_shard_reads_before_it_judges_silence(bench: Any) -> None:
    """The shard's own thread stalled (process stopped, machine starved): workers' silence
    over that time says nothing about them, so nobody is lost on waking."""
    b = bench(heartbeat=1.0, silence_timeout=5.0)
    b.connect("w0")
    b.step()
    b.clock.advance(30.0)  # the shard did not run for 30 s
    b.step()
    assert b.shard.lost == 0
    b.links["w0"].deliver(p.Heartbeat(), b.pipes["w0"])  # its heartbeats were queued
    b.clock.advance(1.0)
    b.step()
    assert b.shard.lost == 0 and b.shard.conns["w0"].state is State.READY
    b.clock.advance(5.5)  # now silent for real
    for _ in range(30):
        b.clock.advance(0.25)
        b.step()
    assert b.shard.lost == 1


def test_a_worker_that_answers_heartbeats_is_kept(bench: Any) -> None:
    b = bench(heartbeat=1.0)
    b.connect("w0")
    for _ in range(10):
        b.clock.advance(1.0)
        b.links["w0"].deliver(p.Heartbeat(), b.pipes["w0"])
        b.step()
    assert b.shard.lost == 0 and b.shard.conns["w0"].state is State.READY


def test_keep_alives_go_to_a_worker_a_quarter_silence_apart_however_short_the_heartbeat(
        bench: Any) -> None:
    """A worker judges the executor's silence only after ``silence_timeout``: four
    keep-alives within it are enough, and a thousand idle workers are not each woken every
    ``heartbeat``. Where the heartbeat is the longer, it sets the pace."""
    b = bench(heartbeat=0.5, silence_timeout=20.0)
    link = b.connect("w0")
    link.take()
    sent_at = []
    for tick in range(1, 121):  # 30 s, in housekeeping's steps
        b.clock.advance(0.25)
        b.links["w0"].deliver(p.Heartbeat(), b.pipes["w0"])  # the worker is there
        b.step()
        if any(isinstance(m, p.Heartbeat) for m in link.take()):
            sent_at.append(tick * 0.25)
    assert sent_at == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    assert p.keepalive(0.5, 20.0) == 5.0 and p.keepalive(2.0, 4.0) == 2.0


def test_a_worker_that_never_connects_fails_to_start_at_start_timeout(bench: Any) -> None:
    b = bench(start_timeout=30.0)
    b.shard.post(ev.Adopt("w0", FakeLink(), _auth.new_nonce()))
    b.step()
    b.clock.advance(29.0)
    b.step()
    assert b.life.named("failed_to_start") == []
    b.clock.advance(2.0)
    b.step()
    assert b.life.named("failed_to_start") == [("failed_to_start", "w0", None)]
    assert "w0" not in b.shard.conns


# ---------------------------------------------------------------- idle retirement

def _hello(b: Any, worker_id: str, executor_nonce: bytes) -> tuple[p.Hello, bytes]:
    """A worker's first message, with a proof over ``executor_nonce``; and its own nonce."""
    nonce = _auth.new_nonce()
    proof = _auth.proof(b.session.secret, "worker", nonce, executor_nonce)
    return p.Hello(worker_id, nonce, 1, "localhost", proof, ""), nonce


def _starting(b: Any) -> tuple[FakeLink, bytes]:
    """Worker w0 being started: its channel adopted, with our nonce for its handshake."""
    link, ours = FakeLink(), _auth.new_nonce()
    b.shard.post(ev.Adopt("w0", link, ours))
    b.step()
    return link, ours


def test_the_handshake_takes_one_round_trip_and_proves_both_sides(bench: Any) -> None:
    b = bench()
    link, ours = _starting(b)
    hello, nonce = _hello(b, "w0", ours)
    link.deliver(hello, FakePipe(1))
    b.step()
    [setup] = [p.decode(frame) for frame in link.sent]
    assert isinstance(setup, p.Setup)
    assert _auth.verify(_auth.proof(b.session.secret, "executor", nonce, ours), setup.proof)
    assert b.shard.conns["w0"].state is State.READY and link.sealed
    assert b.life.named("ready") == [("ready", "w0")]


def test_a_hello_proved_over_another_nonce_is_refused_unanswered(bench: Any) -> None:
    """A recorded Hello of another start (or one made up) gets nothing back: its peer is
    hung up on, counted, and the real worker still gets in."""
    b = bench()
    link, ours = _starting(b)
    for other in (_auth.new_nonce(), b"\0" * 16):
        forged, _ = _hello(b, "w0", other)
        pipe = FakePipe(7)
        link.deliver(forged, pipe)
        b.step()
        assert pipe.closed and link.sent == [] and link.bound is None
    assert b.shard.conns["w0"].state is State.AWAIT_HELLO
    assert b.shard.rejected == 2
    hello, _ = _hello(b, "w0", ours)
    link.deliver(hello, FakePipe(8))
    b.step()
    assert b.shard.conns["w0"].state is State.READY


def test_the_executors_nonce_serves_one_handshake(bench: Any) -> None:
    """Once the worker got in, the same proof again (a replay, on another connection) is
    refused, and the worker's connection is kept."""
    b = bench()
    link, ours = _starting(b)
    hello, _ = _hello(b, "w0", ours)
    link.deliver(hello, FakePipe(1))
    b.step()
    replay = FakePipe(2)
    link.deliver(hello, replay)
    b.step()
    assert replay.closed and b.shard.rejected == 1
    assert b.shard.conns["w0"].state is State.READY and link.bound is not None
    assert link.bound.id == 1 and not link.bound.closed


@pytest.mark.parametrize("probe_of", ["this worker", "a wrong proof", "another executor"])
def test_shared_memory_needs_a_probe_of_ours_holding_the_workers_proof(
        bench: Any, probe_of: str) -> None:
    """The worker's probe decides shared memory and the claim board, in the Setup; the
    shard unlinks a probe of its own whatever it held, and leaves anyone else's alone."""
    b = bench(shm=True)
    link, ours = _starting(b)
    hello, _ = _hello(b, "w0", ours)
    content = os.urandom(32) if probe_of == "a wrong proof" else hello.proof
    probe = _shm.write_probe("elsewhere" if probe_of == "another executor" else "test", content)
    board = ClaimBoard.create(probe)
    assert board is not None
    try:
        link.deliver(hello._replace(shm_probe=probe), FakePipe(1))
        b.step()
        [setup] = [p.decode(frame) for frame in link.sent]
        assert isinstance(setup, p.Setup)
        ok = probe_of == "this worker"
        conn = b.shard.conns["w0"]
        assert (setup.shm, setup.claims, conn.shm, conn.claims is not None) == (ok,) * 4
        left = sorted(n for n in os.listdir(_shm.SHM_DIR) if probe in n)
        assert left == {"this worker": [f"sem.{probe}-claims"],  # ours, for it to open
                        "a wrong proof": [],
                        "another executor": [probe, f"{probe}-claims"]}[probe_of]
        if ok:  # the board works between the two
            assert board.open_lock()
            assert conn.claims is not None and conn.claims.take_back([0]) == {0}
            assert board.claim(0) is False
            conn.claims.close()  # (as when the shard loses the worker: nothing left)
            assert not [n for n in os.listdir(_shm.SHM_DIR) if probe in n]
        else:
            assert not board.open_lock()  # (none made: the Setup said so)
    finally:
        board.close()
        _shm.discard(probe)  # (the worker's side: it unlinks them too)


def test_an_idle_worker_is_asked_to_leave_after_idle_timeout(bench: Any) -> None:
    b = bench(idle_timeout=5.0, heartbeat=10.0)
    link = b.connect("w0")
    b.clock.advance(4.0)
    b.step()
    assert b.life.named("may_retire") == []
    b.clock.advance(2.6)  # housekeeping runs every heartbeat / 4
    b.step()
    assert b.life.named("may_retire") == [("may_retire", "w0")]
    assert [m for m in link.take() if isinstance(m, p.Bye)] == [p.Bye("idle")]
    assert b.shard.conns["w0"].state is State.RETIRING
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))
    b.exit("w0")
    assert b.shard.lost == 0 and "w0" not in b.shard.conns


def test_a_workers_last_word_is_answered_by_hanging_up(bench: Any) -> None:
    """The worker exits only once its link closes: what it sent before has all arrived."""
    b = bench()
    link = b.connect("w0")
    [item] = b.submit(job, 1)
    b.step()
    b.answer("w0", b.tasks_sent("w0"), SHORT)
    link.deliver(p.Bye("max_tasks_per_child reached"), b.pipes["w0"])
    b.step()
    assert item.future.result(timeout=0) == item.task_id
    assert link.closed and b.shard.conns["w0"].state is State.DISCONNECTED
    b.exit("w0")
    assert b.shard.lost == 0 and "w0" not in b.shard.conns


def test_tasks_a_leaving_worker_did_not_run_go_back_uncharged(bench: Any) -> None:
    b = bench()
    link = b.connect("w0")
    [item] = b.submit(job, 1)
    b.step()
    assert b.tasks_sent("w0") == [item.task_id]
    link.deliver(p.Bye("asked to leave"), b.pipes["w0"])
    b.step(1)
    assert link.closed and item.losses == 0 and not item.future.done()
    link1 = b.connect("w1")
    b.step()
    assert b.tasks_sent("w1") == [item.task_id] and not link1.closed


def test_an_initializer_failure_breaks_the_executor_and_hangs_up(bench: Any) -> None:
    b = bench()
    link = b.connect("w0")
    error = dumps_exception(RuntimeError("initializer refused"))
    link.deliver(p.InitFailed(error), b.pipes["w0"])
    b.step()
    assert [c[1] for c in b.life.named("broken")] == [
        "A worker initializer failed, the executor is not usable anymore"]
    assert link.closed and b.shard.conns["w0"].state is State.DISCONNECTED


def test_a_worker_stays_when_the_pool_may_not_shrink_or_work_is_queued(bench: Any) -> None:
    b = bench(idle_timeout=5.0, heartbeat=10.0)
    b.life.retire = False
    link = b.connect("w0")
    b.clock.advance(6.0)
    b.step()
    assert not any(isinstance(m, p.Bye) for m in link.take())
    assert b.shard.conns["w0"].state is State.READY


def test_a_busy_worker_is_never_retired(bench: Any) -> None:
    b = bench(idle_timeout=5.0, heartbeat=10.0)
    b.connect("w0")
    b.submit(job, 1)
    b.step()
    b.clock.advance(6.0)
    b.links["w0"].deliver(p.Heartbeat(), b.pipes["w0"])
    b.step()
    assert b.life.named("may_retire") == []


# ---------------------------------------------------------------- shutdown

def test_shutdown_with_cancel_keeps_what_the_stdlib_call_queue_would_run(bench: Any) -> None:
    b = bench(max_workers=2)
    items = b.submit(job, 10)
    b.shard.post(ev.Shutdown(cancel_futures=True))
    b.step()
    assert [i.future.cancelled() for i in items] == [False] * 3 + [True] * 7
    assert not futures_wait([i.future for i in items[3:]], timeout=0).not_done  # told
    assert not b.shard.finished()  # three still to run


def _send_three_behind_a_short_history(b: Bench) -> list[WorkItem]:
    b.connect("w0")
    for _ in range(2):
        b.submit(job, 1)
        b.step()
        b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)  # the function looks short...
        b.step()
    items = b.submit(job, 3)
    b.step()
    assert b.tasks_sent("w0") == [i.task_id for i in items]  # ...so w0 takes three
    return items


def test_tasks_held_behind_a_long_one_move_to_an_idle_worker(bench: Any) -> None:
    """Elastic: what a busy worker has not started goes to one that is free (newly joined)."""
    b = bench()
    items = _send_three_behind_a_short_history(b)
    w0 = b.links["w0"]
    b.clock.advance(0.5)  # ...but the first one runs long
    b.connect("w1")
    b.step()
    (revoke,) = [m for m in w0.take() if isinstance(m, p.Revoke)]
    assert list(revoke.task_ids) == [i.task_id for i in items[1:]]  # all it has not started
    b.links["w0"].deliver(p.Revoked(revoke.task_ids), b.pipes["w0"])  # it gives them back
    b.step()
    assert b.tasks_sent("w1") == [items[1].task_id]  # the free worker runs the next one
    assert list(b.shard.conns["w0"].inflight) == [items[0].task_id]
    assert [i.task_id for i in b.shard.queue] == [items[2].task_id]  # the last waits, queued
    b.answer("w0", [items[0].task_id], runtime=0.5)
    b.step()
    assert b.tasks_sent("w0") == [items[2].task_id]


@contextmanager
def _claim_board(b: Bench, worker_id: str) -> Iterator[ClaimBoard]:
    """A real claim board between the shard and ``worker_id``; yields the worker's side."""
    probe = f"{_shm.PREFIX}sharedtest-{os.getpid()}-{time.monotonic_ns()}"
    board = ClaimBoard.create(probe)
    assert board is not None
    seen = ClaimBoard.attach(probe)
    assert seen is not None and board.open_lock()
    board.unlink()
    b.shard.conns[worker_id].claims = seen
    try:
        yield board
    finally:
        board.close()


def _held_at_a_maps_end(b: Bench, runtime: float) -> tuple[list[WorkItem], Callable[[int], bool]]:
    """w0 learns that ``job`` takes ``runtime`` and holds three of them behind a fourth it
    runs; then w1 joins, with nothing queued. Returns the four, and w0's claim of the n-th."""
    b.connect("w0")
    board = b.enter(_claim_board(b, "w0"))
    for _ in range(3):
        b.submit(job, 1)
        b.step()
        sent = b.tasks_sent("w0")
        board.claim(b.shard.conns["w0"].inflight[sent[0]].number)
        b.answer("w0", sent, runtime=runtime)
        b.step()
    items = b.submit(job, 4)
    b.step()
    assert b.tasks_sent("w0") == [i.task_id for i in items]
    assert board.claim(items[0].number)  # it runs the first
    numbers = [item.number for item in items]
    b.connect("w1")
    b.step()
    return items, lambda n: bool(board.claim(numbers[n]))


def test_tasks_held_at_a_maps_end_move_to_a_worker_left_idle(bench: Any) -> None:
    """Nothing is queued, w1 idles, w0 holds three 0.5 ms tasks behind its running one: those
    that end sooner on w1 move there, from the end, taken off w0's claim board (w0 is asked
    nothing); w0 keeps as much as w1 gets, and the order it runs them in."""
    b = bench()
    items, claim = _held_at_a_maps_end(b, 0.0005)
    assert b.tasks_sent("w1") == [items[2].task_id, items[3].task_id]
    assert list(b.shard.conns["w0"].inflight) == [items[0].task_id, items[1].task_id]
    assert not [m for m in b.links["w0"].take() if isinstance(m, p.Revoke)]
    assert claim(1) is True  # w0 runs its next one...
    assert claim(2) is False  # ...and drops the ones that moved
    assert items[2].future.running()  # w1 runs it now...
    assert not items[3].future.running()  # ...and holds this one behind it: pending


def test_tiny_tasks_held_at_a_maps_end_stay_where_they_are(bench: Any) -> None:
    """Moving a task costs a send: 10 us tasks end sooner where they are."""
    b = bench()
    items, claim = _held_at_a_maps_end(b, 0.00001)
    assert b.tasks_sent("w1") == []
    assert list(b.shard.conns["w0"].inflight) == [i.task_id for i in items]
    assert claim(1) is True


def test_tasks_held_behind_a_long_one_go_before_later_ones_when_no_worker_idles(
    bench: Any,
) -> None:
    """Submitted before what waits in the queue, they must not wait for the long one while
    other workers run the later tasks (the stdlib's one queue runs them in order)."""
    b = bench()
    items = _send_three_behind_a_short_history(b)
    b.connect("w1")
    later = b.submit(other_job, 4)  # of unknown length: w1 takes one, three wait
    b.step()
    assert b.tasks_sent("w1") == [later[0].task_id]
    assert [i.task_id for i in b.shard.queue] == [i.task_id for i in later[1:]]
    b.clock.advance(0.5)  # w0's first task runs long; no worker is idle
    b.step()
    (revoke,) = [m for m in b.links["w0"].take() if isinstance(m, p.Revoke)]
    assert list(revoke.task_ids) == [i.task_id for i in items[1:]]
    b.links["w0"].deliver(p.Revoked(revoke.task_ids), b.pipes["w0"])
    b.step()
    assert [i.task_id for i in b.shard.queue] == [i.task_id for i in items[1:] + later[1:]]


def test_a_worker_is_never_sent_more_tasks_than_max_tasks_per_child(bench: Any) -> None:
    """Short tasks are sent in batches; a batch stops at the worker's limit (it leaves
    there: more would wait on a worker that will not run them)."""
    b = bench(max_tasks_per_child=4)
    b.connect("w0")
    for _ in range(2):  # the function looks short: it may hold three at once...
        b.submit(job, 1)
        b.step()
        b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
        b.step()
    b.submit(job, 6)
    b.step()
    assert len(b.tasks_sent("w0")) == 2  # ...but it has two left to run


def test_tasks_given_back_unstarted_do_not_count_towards_max_tasks_per_child(
    bench: Any,
) -> None:
    """The worker counts the tasks it ran and leaves at its limit: the shard must go on
    sending it work until then, or both wait for each other."""
    b = bench(max_tasks_per_child=5)  # two ran, three held
    items = _send_three_behind_a_short_history(b)
    b.clock.advance(0.5)  # the first runs long, and a free worker joins
    b.connect("w1")
    b.step()
    (revoke,) = [m for m in b.links["w0"].take() if isinstance(m, p.Revoke)]
    b.links["w0"].deliver(p.Revoked(revoke.task_ids), b.pipes["w0"])  # gives both back
    b.step()
    b.tasks_sent("w1")
    b.answer("w0", [items[0].task_id], runtime=0.5)  # w0 has run three of its five
    b.step()
    assert len(b.tasks_sent("w0")) == 1  # so it is sent one more: its last


def test_a_task_sent_behind_another_runs_only_once_that_one_has_finished(bench: Any) -> None:
    b = bench()
    items = _send_three_behind_a_short_history(b)
    assert [i.future.running() for i in items] == [True, False, False]
    assert (b.shard.running, b.shard.backlog) == (1, 2)
    b.answer("w0", [items[0].task_id], runtime=SHORT)
    b.step()
    assert [i.future.running() for i in items[1:]] == [True, False]  # the next starts there
    b.answer("w0", [items[1].task_id, items[2].task_id], runtime=SHORT)  # both in one message
    b.step()
    assert [i.future.result(timeout=0) for i in items] == [i.task_id for i in items]


def _cancel_in_a_thread(future: Future[Any]) -> tuple[threading.Thread, list[bool]]:
    """`cancel` of a held task waits for the shard's answer: ask from another thread."""
    said: list[bool] = []
    asker = threading.Thread(target=lambda: said.append(future.cancel()))
    asker.start()
    return asker, said


def _revoke_sent(b: Bench, worker_id: str) -> p.Revoke:
    b.shard.step(5.0)  # wakes when the cancel's question is posted
    b.step()
    (revoke,) = [m for m in b.links[worker_id].take() if isinstance(m, p.Revoke)]
    return revoke


def test_a_task_held_behind_another_is_cancelled_once_its_worker_gives_it_back(
    bench: Any,
) -> None:
    b = bench()
    items = _send_three_behind_a_short_history(b)
    assert not items[0].future.cancel()  # running: no question asked
    asker, said = _cancel_in_a_thread(items[2].future)
    revoke = _revoke_sent(b, "w0")
    assert list(revoke.task_ids) == [items[2].task_id]
    assert not items[2].future.cancelled()  # not before the worker says it will not run it
    b.links["w0"].deliver(p.Revoked(revoke.task_ids), b.pipes["w0"])
    b.step()
    asker.join(10)
    assert said == [True] and items[2].future.cancelled()
    assert not futures_wait([items[2].future], timeout=0).not_done  # its waiters were told
    b.answer("w0", [items[0].task_id], runtime=SHORT)
    b.step()
    assert b.tasks_sent("w0") == []  # the cancelled one is not sent again
    assert items[1].future.running()
    b.answer("w0", [items[1].task_id], runtime=SHORT)
    b.step()
    assert not b.shard.conns["w0"].inflight and not b.shard.queue


def test_tasks_held_by_a_worker_that_leaves_are_queued_and_cancel_at_once(bench: Any) -> None:
    """A worker's last word (`Bye`) sends back what it held: those are queued tasks again,
    which `cancel` cancels without asking anyone."""
    b = bench()
    items = _send_three_behind_a_short_history(b)
    b.links["w0"].deliver(p.Bye("asked to leave"), b.pipes["w0"])
    b.step()
    assert b.shard.conns["w0"].state is State.DISCONNECTED
    assert list(b.shard.queue) == items
    assert items[2].future.cancel() and items[2].future.cancelled()
    assert not items[0].future.cancel()  # it had started: it stays running, as the stdlib's


def test_a_held_task_its_worker_had_started_is_not_cancelled(bench: Any) -> None:
    b = bench()
    items = _send_three_behind_a_short_history(b)
    asker, said = _cancel_in_a_thread(items[1].future)
    _revoke_sent(b, "w0")
    b.links["w0"].deliver(p.Revoked([]), b.pipes["w0"])  # too late: it runs it already
    b.step()
    asker.join(10)
    assert said == [False]
    assert items[1].future.running()  # it does run
    b.answer("w0", [items[0].task_id, items[1].task_id], runtime=SHORT)
    b.step()
    assert [i.future.result(timeout=0) for i in items[:2]] == [i.task_id for i in items[:2]]


def test_a_cancel_that_hears_nothing_in_time_says_false_and_the_task_still_runs(
    bench: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shard_module, "CANCEL_WAIT", 0.05)
    b = bench()
    items = _send_three_behind_a_short_history(b)
    asker, said = _cancel_in_a_thread(items[2].future)
    revoke = _revoke_sent(b, "w0")
    asker.join(10)
    assert said == [False]
    b.links["w0"].deliver(p.Revoked(revoke.task_ids), b.pipes["w0"])  # the answer, late
    b.step()
    assert not items[2].future.cancelled()
    assert b.tasks_sent("w0") == [items[2].task_id]  # given back, it is sent again to run


def test_an_idle_worker_wakes_the_shard_when_a_held_task_starts_to_overstay(
    bench: Any,
) -> None:
    """Nothing else may wake the shard before the long task ends: it sets its own deadline
    for the moment the worker holding others up counts as outrunning its estimate."""
    b = bench()
    items = _send_three_behind_a_short_history(b)
    b.connect("w1")  # idle, joined before the first task could be judged
    b.step()
    assert not [m for m in b.links["w0"].take() if isinstance(m, p.Revoke)]
    revokes: list[p.Revoke] = []
    for _ in range(3):  # its next look (rate-limited), then the moment it overstays
        wait_for = b.shard._next_deadline()
        assert 0 < wait_for <= 0.011  # LONG_TASK after it started, not the next housekeeping
        b.clock.advance(wait_for + 0.0001)
        b.step()
        revokes = [m for m in b.links["w0"].take() if isinstance(m, p.Revoke)]
        if revokes:
            break
    assert b.clock() < 1000 + 0.011 + 0.001
    (revoke,) = revokes
    assert list(revoke.task_ids) == [i.task_id for i in items[1:]]


def test_a_queue_behind_busy_workers_holding_nothing_more_lets_the_shard_sleep(
    bench: Any,
) -> None:
    """A look for hoarders that came due while no worker held a task behind another has
    nothing to look at: the shard must sleep until its next real deadline, not spin (it
    burned a core while tasks of 10 ms or longer queued behind busy workers)."""
    b = bench()
    b.connect("w0")
    b.connect("w1")
    b.submit(job, 1)
    b.step()  # w1 idles: a look for hoarders is due soon
    b.submit(job, 5)  # of unknown length: one per worker, the rest queued
    b.step()
    assert not b.shard.idle and len(b.shard.queue) == 4
    b.clock.advance(0.05)  # the look came due; no worker holds a task behind another
    b.step()
    assert b.shard._next_deadline() > 0.1  # the next housekeeping, not at once
    assert len(b.shard.queue) == 4  # nothing moved


def test_a_maps_function_and_the_same_function_submitted_alone_travel_apart(
    bench: Any,
) -> None:
    """In one message, a map's tasks carry the function as the map's call pickled it, and a
    task submitted alone the function as it is now (its globals may have changed since)."""
    from fiberexec._serialize import Snapshot

    b = bench()
    b.connect("w0")
    for _ in range(3):  # short, as expected: several may go in one message
        b.submit(job, 1)
        b.step()
        b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
        b.step()
    snapshot = Snapshot()
    mapped = [WorkItem(100 + i, TaskFuture(), job, (i,), {}, snapshot=snapshot)
              for i in range(2)]
    b.shard.put_all(mapped)
    alone = b.submit(job, 1)
    b.step()
    (message,) = [m for m in b.links["w0"].take() if isinstance(m, p.Tasks)]
    places = {t.task_id: t.function for t in message.tasks}
    assert len(message.functions) == 2
    assert places[100] == places[101] != places[alone[0].task_id]
    assert snapshot.kept[id(job)][1].data == message.functions[places[100]].data  # (decoded)


def test_a_lost_task_is_named_as_written_with_a_hint_that_fits_the_end(bench: Any) -> None:
    b = bench(max_task_retries=0)
    items = _hold_three(b)
    b.shard.post(ev.PipeDown("w0", b.pipes["w0"].id))
    b.step()
    b.shard.post(ev.Exited("w0", WorkerStatus(WorkerState.FAILED, -11)))
    b.step()
    error = items[0].future.exception(timeout=0)
    assert isinstance(error, WorkerLostError)
    message = str(error)
    assert message.startswith(
        f"{__name__}.job({items[0].task_id}) was running on 1 worker that died")
    assert "SIGSEGV" in message and "a fault in native code" in message
    assert "memory" not in message  # a segfault is not a memory problem


class _CountsReprs:
    reprs = 0

    def __repr__(self) -> str:
        type(self).reprs += 1
        return "counted"


def test_a_task_is_described_only_when_it_fails(bench: Any) -> None:
    """A repr of the arguments can cost more than the task (numpy arrays): none on success."""
    b = bench()
    b.connect("w0")
    item = WorkItem(1, Future(), job, (_CountsReprs(),), {})
    b.shard.put(item)
    b.step()
    b.answer("w0", b.tasks_sent("w0"), runtime=SHORT)
    b.step()
    assert item.future.done() and _CountsReprs.reprs == 0


def test_a_heartbeat_brings_usage_and_hands_output_to_the_lifecycle(bench: Any) -> None:
    b = bench()
    b.connect("w0")
    b.links["w0"].deliver(p.Heartbeat(12.5, 1 << 20, b"out\n", b"err\n"), b.pipes["w0"])
    b.step()
    conn = b.shard.conns["w0"]
    assert (conn.cpu_percent, conn.rss_bytes) == (12.5, 1 << 20)
    assert b.life.named("output") == [("output", "w0", conn.host, b"out\n", b"err\n")]
    b.links["w0"].deliver(p.Heartbeat(), b.pipes["w0"])  # nothing printed: nothing handed on
    b.step()
    assert len(b.life.named("output")) == 1


def test_cancelling_a_held_task_that_already_failed_asks_nobody(bench: Any) -> None:
    """A held task failed with its executor (broken): `cancel` says False at once, as for
    any finished future, without waiting for a shard that may be gone."""
    b = bench()
    items = _send_three_behind_a_short_history(b)
    b.shard._fail_everything(RuntimeError("the executor broke"))
    assert items[2].future.exception(timeout=0) is not None
    assert not items[2].future.cancel()  # from this thread, with no shard thread to answer
    assert not b.shard.events  # no question was posted to the shard


# ---------------------------------------------------------------- message sizes

def _submit_args(b: Bench, args: tuple[Any, ...], n: int) -> list[WorkItem]:
    items = []
    for _ in range(n):
        b._task_ids += 1
        item = WorkItem(b._task_ids, TaskFuture(), job, args, {})
        b.shard.put(item)
        items.append(item)
    return items


def test_arguments_no_message_can_carry_fail_their_task_and_not_the_worker(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """(The limit made small here: a real one is 1.94 GiB, for a worker that does not share
    this host's shared memory.)"""
    from fiberexec._errors import SerializationError

    monkeypatch.setattr(p, "MAX_PAYLOAD", 4000)
    b = bench()
    link = b.connect("w0")
    [big] = _submit_args(b, (b"x" * 5000,), 1)
    [small] = _submit_args(b, (b"y" * 100,), 1)
    b.step()
    with pytest.raises(SerializationError, match="pickle to 5.* bytes, more than the 4000 "
                       "bytes one message may carry") as info:
        big.future.result(timeout=0)
    assert "(the task: tests.test_shard.job(b'xxxxxxxx...xxxxxxxxxx'))" in str(info.value)
    assert b.tasks_sent("w0") == [small.task_id] and not link.closed


def test_a_failed_map_chunk_is_named_by_its_first_items_call() -> None:
    """As it reads in an error and inside ``f(...)`` on the dashboard and in ``top``."""
    from fiberexec._chunks import map_chunk, starmap_chunk
    from fiberexec._task import describe

    def chunk(runner: Any, items: tuple[Any, ...]) -> WorkItem:
        return WorkItem(1, TaskFuture(), runner, (job, items), {})

    assert describe(chunk(starmap_chunk, ((1, "a"), (2, "b")))) == (
        "tests.test_shard.job(1, 'a' [the first of a chunk of 2 map items])")
    assert describe(chunk(map_chunk, ((1, "a"),))) == (
        "tests.test_shard.job((1, 'a') [the first of a chunk of 1 map item])")


def test_a_message_of_tasks_stops_growing_at_the_batch_room(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside the tasks already in a message there is always room for one more of any size
    a message may carry (so no message is over the limit): once they take `BATCH_ROOM`, the
    next task goes in the next message."""
    monkeypatch.setattr(p, "BATCH_ROOM", 5000)
    b = bench()
    link = b.connect("w0")
    _submit_args(b, (b"z" * 2000,), 60)
    b.step()
    counts = []
    for _ in range(5):
        messages = [m for m in link.take() if isinstance(m, p.Tasks)]
        counts += [len(m.tasks) for m in messages]
        b.answer("w0", [t.task_id for m in messages for t in m.tasks], runtime=SHORT)
        b.step()
    assert max(counts) == 3 and sum(counts) > 5 * 3  # a round's tasks span messages


# ---------------------------------------------------------------- a waiting thread reads

@contextmanager
def shard_thread(b: Bench) -> Iterator[threading.Thread]:
    """The shard's own loop on its thread, as an executor runs it; asleep when this yields."""
    thread = threading.Thread(target=b.shard.run, daemon=True)
    thread.start()
    with b.shard.owner:  # free only while the loop sleeps in select
        pass
    try:
        yield thread
    finally:
        b.shard.post(ev.Shutdown(False))
        thread.join(10)
        assert not thread.is_alive()


def _settled_on(future: Future[Any]) -> list[int]:
    """The thread that settles ``future`` (sets its result or exception)."""
    threads: list[int] = []

    def noting(original: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any) -> Any:
            threads.append(threading.get_ident())
            return original(*args)
        return noted

    future.set_result = noting(future.set_result)  # type: ignore[method-assign]
    future.set_exception = noting(future.set_exception)  # type: ignore[method-assign]
    return threads


def _called_back_on(future: Future[Any]) -> tuple[list[int], threading.Event]:
    """The thread ``future``'s done-callback runs on, and an event set once it ran."""
    threads: list[int] = []
    ran = threading.Event()

    def callback(_: Future[Any]) -> None:
        threads.append(threading.get_ident())
        ran.set()

    future.add_done_callback(callback)
    return threads, ran


def _wait_in_a_thread(future: Future[Any], reading: threading.Event,
                      monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Thread, list[Any]]:
    """``future.result()`` on a new thread; ``reading`` is set once it reads its worker."""
    collect = Shard._collect

    def noted(self: Shard, *args: Any) -> None:
        reading.set()
        collect(self, *args)

    monkeypatch.setattr(Shard, "_collect", noted)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(future.result(timeout=30)))
    waiter.start()
    return waiter, got


def test_a_thread_waiting_for_a_task_it_sent_reads_the_answer_itself(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the shard's thread sleeps, a submitting thread sends the task itself, and the
    thread that then waits for it takes in the answer: no hand-off through the shard's
    thread on either way. Its done-callbacks are handed to the shard's thread, as the
    stdlib runs them on its own (a callback taking a lock the waiter holds would hang)."""
    b = bench(heartbeat=60.0)
    b.connect("w0")
    with shard_thread(b) as runner:
        [item] = b.submit(job, 1)
        assert b.tasks_sent("w0") == [item.task_id]  # sent from this thread, at once
        settled = _settled_on(item.future)
        called_back, ran = _called_back_on(item.future)
        reading = threading.Event()
        waiter, got = _wait_in_a_thread(item.future, reading, monkeypatch)
        assert reading.wait(10)
        b.answer("w0", [item.task_id], runtime=SHORT)
        waiter.join(10)
        assert got == [item.task_id] and settled == [waiter.ident]
        assert ran.wait(10) and called_back == [runner.ident]
        assert b.shard.conns["w0"].idle_since and "w0" in b.shard.idle  # ready for more


def test_a_pools_result_is_told_on_the_thread_that_reads_its_answer(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's result (`multiprocessing.Pool.apply`) waits on its own event, set by a
    `Prompt` callback of its task's future. The thread that waits reads the answer itself
    (`TaskFuture.collect`) and runs that callback there, so no other thread has to wake it;
    a plain callback of another future it settles still runs on the shard's thread."""
    b = bench(heartbeat=60.0)
    with _one_task_each(b) as (first, second, runner):
        told_on: list[int] = []
        told = threading.Event()

        def tell(_: Future[Any]) -> None:
            told_on.append(threading.get_ident())
            told.set()

        first.future.add_done_callback(_future.Prompt(tell))
        called_back, ran = _called_back_on(second.future)
        reads = _reads_noted(monkeypatch)
        waiter = threading.Thread(target=lambda: (
            cast("TaskFuture[Any]", first.future).collect(30), told.wait(30)))
        waiter.start()
        assert reads.wait_for(1)
        b.answer("w0", [first.task_id], runtime=SHORT)
        waiter.join(10)
        assert told_on == [waiter.ident]
        b.answer("w1", [second.task_id], runtime=SHORT)
        assert ran.wait(10) and called_back == [runner.ident]


def test_a_thread_in_wait_reads_the_answers_of_the_tasks_it_sent(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`concurrent.futures.wait` reads the answers of tasks sent while the shard's thread
    slept on the waiting thread, as `result()` does: both workers' links at once, until
    every future it waits for is done, with no hand-off through the shard's thread."""
    b = bench(heartbeat=60.0)
    with _one_task_each(b) as (first, second, _):
        settled = [_settled_on(first.future), _settled_on(second.future)]
        reads = _reads_noted(monkeypatch)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(
            futures_wait([first.future, second.future], timeout=30)))
        waiter.start()
        assert reads.wait_for(1)
        b.answer("w0", [first.task_id], runtime=SHORT)
        b.answer("w1", [second.task_id], runtime=SHORT)
        waiter.join(10)
        assert got[0].done == {first.future, second.future} and not got[0].not_done
        assert settled == [[waiter.ident], [waiter.ident]]
        assert reads.count == 1


def test_a_thread_in_as_completed_reads_each_answer_as_it_waits_again(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`concurrent.futures.as_completed` waits once a future: each wait reads the links of
    the futures not yet done, on the waiting thread."""
    b = bench(heartbeat=60.0)
    with _one_task_each(b) as (first, second, _):
        settled = [_settled_on(first.future), _settled_on(second.future)]
        reads = _reads_noted(monkeypatch)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.extend(
            f.result() for f in as_completed([first.future, second.future], timeout=30)))
        waiter.start()
        assert reads.wait_for(1)
        b.answer("w0", [first.task_id], runtime=SHORT)
        assert reads.wait_for(2)  # it yielded the first, and waits for the second
        b.answer("w1", [second.task_id], runtime=SHORT)
        waiter.join(10)
        assert got == [first.task_id, second.task_id]
        assert settled == [[waiter.ident], [waiter.ident]]


def test_a_thread_in_wait_lets_go_when_an_answer_frees_a_worker_for_queued_tasks(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting thread that reads an answer freeing a worker while tasks wait in the queue
    stops reading there: the queued tasks go out at once, not once it has read its time
    (here a minute)."""
    monkeypatch.setattr("fiberexec._future.COLLECT_MAX", 60.0)
    # (the fake clock stands still: the shard's next look at what waits is never due, as
    # between two looks on a real clock, so it sleeps with tasks in its queue)
    monkeypatch.setattr(Shard, "_next_deadline", lambda self: 60.0)
    b = bench(heartbeat=600.0)
    with _one_task_each(b) as (first, second, _):
        queued = b.submit(job, 2)  # of unknown length: no worker takes one behind its task
        asleep_with_a_queue = threading.Event()
        select = b.shard.selector.select

        def sleeping(timeout: float | None = None) -> Any:
            if b.shard.queue and not b.shard.incoming:
                asleep_with_a_queue.set()
            return select(timeout)

        monkeypatch.setattr(b.shard.selector, "select", sleeping)
        b.shard.post(ev.Call(lambda: None))  # a turn takes the two in: they wait in the queue
        assert asleep_with_a_queue.wait(10)
        sent_to_w0 = threading.Event()
        link, send = b.links["w0"], b.links["w0"].send_nowait

        def noting(frame: bytes) -> None:
            send(frame)
            if isinstance(p.decode(frame), p.Tasks):
                sent_to_w0.set()

        monkeypatch.setattr(link, "send_nowait", noting)
        reads = _reads_noted(monkeypatch)
        futures = [item.future for item in (first, second, *queued)]
        waiter = threading.Thread(target=lambda: futures_wait(futures, timeout=30))
        waiter.start()
        assert reads.wait_for(1)
        assert not b.tasks_sent("w0")
        b.answer("w0", [first.task_id], runtime=SHORT)
        assert sent_to_w0.wait(10)
        b.answer("w1", [second.task_id], runtime=SHORT)
        for _ in range(10):  # answer what each worker is sent until all four are done
            for worker_id in ("w0", "w1"):
                if sent := b.tasks_sent(worker_id):
                    b.answer(worker_id, sent, runtime=SHORT)
            if not futures_wait(futures, timeout=1).not_done:
                break
        waiter.join(10)
        assert all(f.result(timeout=0) == item.task_id
                   for f, item in zip(futures, (first, second, *queued), strict=True))


@contextmanager
def _one_task_each(b: Bench) -> Iterator[tuple[WorkItem, WorkItem, threading.Thread]]:
    """Two workers (``w0``, ``w1``) and the shard's loop on its thread (yielded third); two
    tasks submitted while that thread sleeps: the submitting thread sends each to a worker
    of its own."""
    b.connect("w0")
    b.connect("w1")
    with shard_thread(b) as runner:
        first, second = b.submit(job, 2)
        assert b.tasks_sent("w0") == [first.task_id] and b.tasks_sent("w1") == [second.task_id]
        yield first, second, runner


class _Reads:
    """How many times a waiting thread began to read its workers' links (`Shard._collect`)."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def noted(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_for(self, count: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, timeout=10)


def _reads_noted(monkeypatch: pytest.MonkeyPatch) -> _Reads:
    reads = _Reads()
    collect = Shard._collect

    def noted(self: Shard, *args: Any) -> None:
        reads.noted()
        collect(self, *args)

    monkeypatch.setattr(Shard, "_collect", noted)
    return reads


def test_a_thread_reading_its_answer_lets_go_when_another_worker_answers(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing waits for the reading thread: another worker's answer is taken in by the
    shard's thread as it comes (here the reading thread could read for a minute)."""
    monkeypatch.setattr("fiberexec._future.COLLECT_MAX", 60.0)
    b = bench(heartbeat=600.0)
    with _one_task_each(b) as (first, second, _):
        settled = _settled_on(second.future)
        _, done = _called_back_on(second.future)  # (a wait in result() could read it here)
        reading = threading.Event()
        waiter, got = _wait_in_a_thread(first.future, reading, monkeypatch)
        assert reading.wait(10)
        b.answer("w1", [second.task_id], runtime=SHORT)
        assert done.wait(10) and second.future.result(timeout=0) == second.task_id
        assert settled and settled[0] not in (waiter.ident, threading.get_ident())
        assert not first.future.done() and waiter.is_alive()
        b.answer("w0", [first.task_id], runtime=SHORT)
        waiter.join(10)
        assert got == [first.task_id]


@pytest.mark.parametrize("first_heartbeat_last", [False, True])
def test_a_workers_window_covers_its_shortest_round_trip_in_any_order(
        first_heartbeat_last: bool) -> None:
    """A far worker holds enough to cover its round trip (``WINDOW_TIME`` plus two), from
    the shortest one seen, whether a task sent idle or the first heartbeat is measured
    first. (A task sent before the first heartbeat arrived used to keep the window at
    ``WINDOW_TIME``: 2 ms RTT workers then idled half the time.)"""
    from fiberexec._conn import Conn

    conn = Conn("w0", cast(Any, None), 0, now=0.0)
    if first_heartbeat_last:
        conn.timed = (1, 0.0)  # a task went to it idle before its first word came
    measures = [0.004, 0.0025, 0.003]
    for seconds in measures:
        conn.measured_rtt(seconds)
    assert conn.rtt == 0.0025
    assert conn.window == pytest.approx(WINDOW_TIME + 2 * 0.0025)
    conn.measured_rtt(10.0)  # a slow one says more about the peer than the link
    assert conn.window == pytest.approx(WINDOW_TIME + 2 * 0.0025)
