"""Queues consumed by several processes: no consumer keeps items another one waits for.

Items may travel to a consumer ahead of its gets (as they sit in the standard library's
pipe); whatever the consumer has not taken stays available to any other consumer that
waits, to ``qsize()``, and to the queue once the consumer's process ends.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)


def _idle_consumer(mpm: ModuleType) -> tuple[ModuleType, object, object, object, object]:
    """A child that took one item and now idles; then ten more items are put."""
    ctx = mpm.get_context("spawn")
    q, got, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    idle = ctx.Process(target=t.take_one_then_idle, args=(q, got, stop))
    idle.start()
    q.put("first")
    assert got.get(timeout=60) == "first"
    for i in range(10):
        q.put(i)
    time.sleep(0.3)  # time for items to travel ahead to the idle consumer, if they would
    return ctx, q, got, stop, idle


def test_a_waiting_consumer_gets_what_an_idle_one_was_sent(mpm: ModuleType) -> None:
    ctx, q, got, stop, idle = _idle_consumer(mpm)
    assert q.qsize() == 10 and not q.empty()  # type: ignore[attr-defined]
    other = ctx.Process(target=t.take_n, args=(q, got, 5))  # type: ignore[attr-defined]
    other.start()
    assert got.get(timeout=30) == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]
    other.join(60)
    assert [q.get(timeout=10) for _ in range(5)] == [5, 6, 7, 8, 9]  # type: ignore[attr-defined]
    assert q.empty() and q.qsize() == 0  # type: ignore[attr-defined]
    stop.set()  # type: ignore[attr-defined]
    idle.join(60)  # type: ignore[attr-defined]
    assert (idle.exitcode, other.exitcode) == (0, 0)  # type: ignore[attr-defined]


def test_items_a_killed_consumer_had_not_taken_stay_in_the_queue(mpm: ModuleType) -> None:
    _, q, _, _, idle = _idle_consumer(mpm)
    idle.kill()  # type: ignore[attr-defined]
    idle.join(60)  # type: ignore[attr-defined]
    assert [q.get(timeout=10) for _ in range(10)] == list(range(10))  # type: ignore[attr-defined]
    assert q.empty()  # type: ignore[attr-defined]


@pytest.mark.parametrize("taken", [3, 70])  # fewer, and more, than a report's worth
def test_a_consumer_killed_after_taking_items_quietly_loses_and_repeats_none(
        mpm: ModuleType, taken: int) -> None:
    """A consumer that keeps up with its queue says only now and then what it took (the
    creator reads its count from shared memory where it can): when it is killed, the
    items it took are neither handed out again nor missing from the queue's size."""
    ctx = mpm.get_context("spawn")
    q, got, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    for i in range(200):
        q.put(i)
    child = ctx.Process(target=t.take_n_then_idle, args=(q, got, taken, stop))
    child.start()
    assert got.get(timeout=60) == list(range(taken))  # type: ignore[attr-defined]
    assert q.qsize() == 200 - taken  # type: ignore[attr-defined]
    child.kill()  # type: ignore[attr-defined]
    child.join(60)  # type: ignore[attr-defined]
    rest = [q.get(timeout=10) for _ in range(200 - taken)]  # type: ignore[attr-defined]
    assert rest == list(range(taken, 200))
    assert q.empty()  # type: ignore[attr-defined]


@pytest.mark.parametrize("first", ["consumer", "producer"])
def test_more_bytes_than_are_sent_ahead_all_arrive_after_the_producer_stops(
        mpm: ModuleType, first: str) -> None:
    """12 items of 300 kB (more than a consumer is sent ahead of its gets, 1 MiB), put once,
    before or after the consumer starts waiting: it gets every one."""
    ctx = mpm.get_context("spawn")
    q, got = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=t.take_sizes, args=(q, got, 12))
    q.put("first")
    if first == "consumer":
        child.start()
        assert got.get(timeout=60) == "first"  # type: ignore[attr-defined]  # it took one
    for i in range(12):
        q.put(bytes([i]) * 300_000)
    if first == "producer":
        child.start()
        assert got.get(timeout=60) == "first"  # type: ignore[attr-defined]
    sizes = got.get(timeout=60)  # type: ignore[attr-defined]
    assert sizes == [(i, 300_000) for i in range(12)]
    child.join(60)  # type: ignore[attr-defined]
    assert child.exitcode == 0  # type: ignore[attr-defined]


def test_many_consumers_take_each_item_once(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    q, got, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    consumers = [ctx.Process(target=t.take_until_none, args=(q, got, go)) for _ in range(3)]
    for p in consumers:
        p.start()
    for i in range(600):
        q.put(i)
    # the creator consumes too; first, as the consumers may be quick enough to take all
    # 600 before its first get (with either module)
    here = [q.get(timeout=30) for _ in range(50)]
    go.set()
    for _ in consumers:
        q.put(None)
    taken = [got.get(timeout=60) for _ in consumers]
    for p in consumers:
        p.join(60)
    everything = sorted(here + [item for part in taken for item in part])
    assert everything == list(range(600))
    assert q.empty() and q.qsize() == 0


def test_each_consumer_takes_items_in_the_order_they_were_put(mpm: ModuleType) -> None:
    """Items sent ahead to one consumer and handed back when another waits come before
    every later item, as they sit in the stdlib's pipe."""
    ctx = mpm.get_context("spawn")
    q, got, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    consumers = [ctx.Process(target=t.say_then_take_until_none, args=(q, got, go))
                 for _ in range(3)]
    for p in consumers:
        p.start()
    for _ in consumers:  # each consumer takes one: all of them are running and getting
        q.put("first")
    assert [got.get(timeout=60) for _ in consumers] == ["first"] * 3
    go.set()
    n = 20000
    for i in range(n):
        q.put(i)
    for _ in consumers:
        q.put(None)
    taken = [got.get(timeout=60) for _ in consumers]
    for p in consumers:
        p.join(60)
    assert sorted(item for part in taken for item in part) == list(range(n))
    for part in taken:
        assert part == sorted(part)


def test_items_taken_before_an_event_are_not_counted_after_it(mpm: ModuleType) -> None:
    """A child takes every item, then sets an event: the creator's ``qsize()`` after the
    event counts none (the take is reported before the event, on another connection)."""
    ctx = mpm.get_context("spawn")
    q, go, done = ctx.Queue(6), ctx.Event(), ctx.Event()
    rounds = 10
    p = ctx.Process(target=t.take_then_say, args=(q, 6, go, done, rounds))
    p.start()
    for _ in range(rounds):
        for i in range(6):
            q.put(i)
        assert q.full()
        done.clear()
        go.set()
        assert done.wait(60)
        assert q.qsize() == 0 and q.empty()
    go.set()
    p.join(60)
    assert p.exitcode == 0


def _first_used_at_once(q: Any) -> list[Any]:
    """A reader waiting on a new queue and four writers, let go at the same moment: what
    the reader got."""
    start, got = threading.Barrier(5), []

    def reader() -> None:
        start.wait()
        got.extend(q.get(timeout=30) for _ in range(4))

    def writer(i: int) -> None:
        start.wait()
        q.put(i)

    threads = [threading.Thread(target=reader)] + [
        threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


def test_threads_first_using_a_new_queue_at_once_all_use_the_one_queue(
        mpm: ModuleType) -> None:
    """A queue made in one thread and first used by several at the same moment (a reader
    waiting before anything is put, writers starting together) is one queue for them all."""
    for _ in range(10):
        assert sorted(_first_used_at_once(mpm.Queue())) == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", ["Queue", "SimpleQueue"])
def test_a_closed_queue_refuses_use_as_the_stdlibs_does(mpm: ModuleType, kind: str) -> None:
    """The stdlib's `Queue` raises ValueError; its `SimpleQueue`, whose pipe ends are closed,
    OSError."""
    q = getattr(mpm, kind)()
    q.close()
    expected = ValueError if kind == "Queue" else OSError
    with pytest.raises(expected):
        q.put(1)
    with pytest.raises(expected):
        q.get()


def test_a_get_that_began_after_another_returned_an_item_returns_a_later_one(
        mpm: ModuleType) -> None:
    """Two consumer processes get with short timeouts while items come now and then: as
    with one FIFO, a get that began after another one returned ``i`` returns an item after
    ``i``, however the timeouts fall (a get that gave up as an item was on its way to it
    took it back from nobody: a later get of its process then returned it, after others
    had taken later items)."""
    import random

    ctx = mpm.get_context("spawn")
    q, got = ctx.Queue(), ctx.Queue()
    consumers = [ctx.Process(target=t.timed_gets_until_none, args=(q, got, 0.001))
                 for _ in range(2)]
    for consumer in consumers:
        consumer.start()
    draw = random.Random(7)
    for item in range(300):
        q.put(item)
        time.sleep(draw.choice((0, 0.0005, 0.001, 0.002)))
    for _ in consumers:
        q.put(None)
    takes = [take for _ in consumers for take in got.get(timeout=60)]
    for consumer in consumers:
        consumer.join(60)
    assert sorted(item for item, _, _ in takes) == list(range(300))
    by_end = sorted(takes, key=lambda take: take[2])
    for item, began, _ in takes:
        before = [earlier for earlier, _, ended in by_end if ended < began]
        assert not before or max(before) < item, (
            f"a get that began after {max(before)} was returned gave {item}")


def test_what_a_child_put_last_arrives_though_items_sent_it_ahead_are_unread(
        mpm: ModuleType) -> None:
    """A child takes one item of many queued for it, puts a large result and ends at once:
    the result arrives, as the stdlib's queue flushes its feeder at exit, and the items it
    did not take (some sent ahead to it) are the next consumer's."""
    ctx = mpm.get_context("spawn")
    inq, outq = ctx.Queue(), ctx.Queue()
    for i in range(200):
        inq.put(i)
    size = 4 << 20
    kid = ctx.Process(target=t.take_one_put_large, args=(inq, outq, size))
    kid.start()
    item, data = outq.get(timeout=60)  # (before the join: the stdlib's child waits for it)
    assert (item, len(data)) == (0, size)
    kid.join(60)
    assert kid.exitcode == 0
    assert sorted(inq.get(timeout=30) for _ in range(199)) == list(range(1, 200))


def test_a_contexts_simple_queue_is_shared_by_several_processes(mpm: ModuleType) -> None:
    """What the stdlib's `Pool` and `ProcessPoolExecutor` build their queues from: the
    context's `SimpleQueue`, handed to children as arguments, where several processes get
    and put under its locks."""
    ctx = mpm.get_context("spawn")
    inq, outq = ctx.SimpleQueue(), ctx.SimpleQueue()
    kids = [ctx.Process(target=t.simple_queue_double, args=(inq, outq, 50)) for _ in range(2)]
    for kid in kids:
        kid.start()
    for i in range(100):
        inq.put(i)
    for kid in kids:  # (first: a get of a SimpleQueue waits without a timeout)
        kid.join(40)  # (within the test's time limit: a kid stuck says so in its exitcode)
    assert [kid.exitcode for kid in kids] == [0, 0]
    assert sorted(outq.get() for _ in range(100)) == [2 * i for i in range(100)]
    assert inq.empty() and outq.empty()
    inq.close()
    with pytest.raises(OSError):
        inq.put(1)
