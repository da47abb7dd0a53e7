"""Queues between two children: a producer sends to the queue's only consumer directly
(`_route`), and order, other consumers, dead consumers and exiting producers behave as
with the standard library's queues (whose items wait in one pipe any consumer reads)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import fiberexec.multiprocessing as fmp
from tests.mp import compat_tasks as c
from tests.mp import route_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)
N = 1000


def _start(ctx: Any, target: Any, *args: Any) -> Any:
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


def _via(mpm: ModuleType) -> str:
    """How a producer's last put went once its consumer was running."""
    return "direct" if mpm is fmp else "stdlib"


def _fed_idle_consumer(mpm: ModuleType, hold: bool) -> tuple[Any, Any, Any, Any, Any]:
    """A child that took one item and now idles, then a producer child that put ``N``
    items (and, if ``hold``, stays alive until the returned event is set)."""
    ctx = mpm.get_context("spawn")
    q, got, stop, done, keep = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Event()
    idle = _start(ctx, c.take_one_then_idle, q, got, stop)
    q.put("first")  # the creator only puts: the child is the queue's only consumer
    assert got.get(timeout=60) == "first"
    producer = _start(ctx, t.put_paced, q, N, done, None, keep if hold else None, True)
    assert done.get(timeout=60) == _via(mpm)
    return q, idle, producer, stop, keep


def test_a_producers_items_reach_the_consumer_in_order(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    q, got, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    consumer = _start(ctx, c.take_n, q, got, N + 1)
    q.put(-1)  # the creator only puts
    producer = _start(ctx, t.put_paced, q, N, done)
    # started through the creator (before the consumer waited), then directly
    assert done.get(timeout=60) in ("relay", _via(mpm))
    assert got.get(timeout=60) == [-1, *range(N)]
    for p in (producer, consumer):
        p.join(60)
        assert p.exitcode == 0
    assert q.empty()


def test_items_queued_before_the_route_come_before_those_sent_on_it(
        mpm: ModuleType) -> None:
    """The creator holds a backlog (relayed before the consumer existed, more than it
    sends ahead) when the producer starts sending directly: the backlog comes first."""
    ctx = mpm.get_context("spawn")
    q, got, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    go, resume, keep = ctx.Event(), ctx.Event(), ctx.Event()
    producer = _start(ctx, t.put_in_two_parts, q, 600, N, go, done, keep)
    assert done.get(timeout=60) == "part one"
    consumer = _start(ctx, t.take_one_then_rest, q, got, resume, N)
    assert got.get(timeout=60) == 0
    go.set()
    assert done.get(timeout=60) == _via(mpm)
    resume.set()
    assert got.get(timeout=60) == list(range(N))  # the producer still runs
    keep.set()
    for p in (producer, consumer):
        p.join(60)
        assert p.exitcode == 0


def test_two_producers_keep_each_ones_order(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    q, got, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    consumer = _start(ctx, c.take_n, q, got, 2 * N)
    producers = [_start(ctx, t.put_paced, q, N, done, tag) for tag in "ab"]
    taken = got.get(timeout=60)
    for tag in "ab":
        assert [i for (which, i) in taken if which == tag] == list(range(N))
    for p in (*producers, consumer):
        p.join(60)
        assert p.exitcode == 0


def test_another_consumer_gets_what_was_sent_to_an_idle_one(mpm: ModuleType) -> None:
    q, idle, producer, stop, keep = _fed_idle_consumer(mpm, hold=True)
    if mpm is fmp:  # counted where they wait (the count may trail the last few puts)
        sizes = [q.qsize() for _ in range(200)]
        assert max(sizes) <= N and N in sizes, sizes[-5:]
    assert [q.get(timeout=10) for _ in range(N)] == list(range(N))
    assert q.empty() and q.qsize() == 0
    keep.set()
    stop.set()
    for p in (producer, idle):
        p.join(60)
        assert p.exitcode == 0


@pytest.mark.parametrize("producer_alive", [True, False], ids=["producer-alive",
                                                                "producer-exited"])
def test_items_a_killed_consumer_had_not_taken_stay_in_the_queue(
        mpm: ModuleType, producer_alive: bool, capfd: pytest.CaptureFixture[str]) -> None:
    """An exiting producer has its consumer hand back what it did not take (it goes
    through the queue's creator then), and exits without waiting out a limit."""
    q, idle, producer, _, keep = _fed_idle_consumer(mpm, hold=producer_alive)
    if not producer_alive:
        producer.join(60)
        assert producer.exitcode == 0
        assert "settled within" not in capfd.readouterr().err  # a warning if it waited
    idle.kill()
    idle.join(60)
    assert [q.get(timeout=10) for _ in range(N)] == list(range(N))
    assert q.empty()
    keep.set()
    producer.join(60)
    assert producer.exitcode == 0


@pytest.mark.parametrize("taken", [5, 300])
def test_a_consumer_killed_after_taking_direct_items_loses_and_repeats_none(
        mpm: ModuleType, taken: int) -> None:
    """The consumer counts what it takes of a producer's direct items where the producer
    reads it (its tally page), with no message per item: killed, what it took is not put
    back, and the rest is, in order."""
    ctx = mpm.get_context("spawn")
    q, got, done = ctx.Queue(), ctx.Queue(), ctx.Queue()
    resume, stop, keep = ctx.Event(), ctx.Event(), ctx.Event()
    consumer = _start(ctx, t.take_one_then_some, q, got, resume, taken, stop)
    q.put("first")  # the creator only puts: the child is the queue's only consumer
    assert got.get(timeout=60) == "first"
    producer = _start(ctx, t.put_paced_saying_where, q, N, done, keep)
    assert done.get(timeout=60) == _via(mpm)
    producer_namespace = done.get(timeout=60)
    resume.set()
    items, how, consumer_namespace = got.get(timeout=60)
    assert items == list(range(taken))
    if mpm is not fmp:
        assert how == "stdlib"
    else:  # the page where the producer can map it (one host and PID namespace), else a
        # message per item (workers in containers of their own)
        assert how == ("counted" if producer_namespace == consumer_namespace else "taken")
    consumer.kill()
    consumer.join(60)
    assert [q.get(timeout=10) for _ in range(N - taken)] == list(range(taken, N))
    assert q.empty()
    keep.set()  # (not ``stop``: the stdlib's Event can hang waking a killed waiter)
    producer.join(60)
    assert producer.exitcode == 0
