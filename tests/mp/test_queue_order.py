"""The broker hands out a queue's items in the order they were put, whoever takes them.

Items sent ahead to a consumer process come before every item the channels still holds:
no other consumer (a get in the creator, or a consumer process that waits) is handed a
later item while they are neither taken nor handed back. Driven step by step through the
broker's own entry points (`_channels.Channels.step` for what consumers send), with
recording peers in place of consumer streams."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fiberexec.multiprocessing import _tally
from fiberexec.multiprocessing._broker import get_broker
from fiberexec.multiprocessing._channels import EMPTY, OK, Channels
from fiberexec.multiprocessing._frames import (
    Feed,
    Frame,
    Items,
    Returned,
    Revoke,
    Tallied,
    Tally,
    Unroute,
    Want,
)


class Consumer:
    """Stands for a consumer process's stream (`_hub.Peer`): records what it was sent."""

    def __init__(self) -> None:
        self.got: list[Any] = []
        self.revoked = 0
        self.inlet = ""
        self.gone = self.ended = False
        self.holder: str | None = None
        self.tally: _tally.TallyView | None = None  # as `_hub.Peer`: what the broker maps
        self.slots: dict[int, int] = {}
        self.fed: list[bool] = []  # what it was told (`Feed`)
        self.tallied: list[int] = []
        self.frames: list[int] = []  # items per frame sent

    def send(self, frame: Frame) -> None:
        match frame:
            case Items(_cid, items):
                self.got.extend(pickle.loads(item) for item in items)
                self.frames.append(len(items))
            case Revoke():
                self.revoked += 1
            case Unroute():
                pass
            case Feed(_cid, on):
                self.fed.append(on)
            case Tallied(cid):
                self.tallied.append(cid)
            case _:
                raise AssertionError(f"a consumer was sent {frame!r}")


@pytest.fixture
def queue() -> Iterator[tuple[Channels, int]]:
    """A queue of this process's broker, fed frames by the test."""
    channels = get_broker().channels
    cid = channels.new(0, -1)
    yield channels, cid
    del channels.chans[cid]


def _put(channels: Channels, cid: int, items: range) -> None:
    for i in items:
        channels.append(cid, pickle.dumps(i))
    channels.feeder.flush()  # what a put left to the feeder thread is sent now, if not yet


def _get_here(channels: Channels, cid: int) -> Any:
    status, body = channels.get(cid, 0.0)
    return pickle.loads(body) if status == OK else status


def test_a_get_here_waits_for_what_an_idle_consumer_was_sent_ahead(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    idle = Consumer()
    channels.step(idle, Want(cid, 0, 0, 0, 4))  # took nothing, waits for nothing, window 4
    _put(channels, cid, range(10))
    assert idle.got == [0, 1, 2, 3]  # sent ahead; 4.. stay here
    assert _get_here(channels, cid) == EMPTY  # not 4: 0..3 come first
    assert idle.revoked == 1
    channels.step(idle, Returned(cid, 1, 0, 0))  # it took 0; 1..3 come back
    assert [_get_here(channels, cid) for _ in range(9)] == list(range(1, 10))
    _put(channels, cid, range(10, 12))  # not sent ahead to it again until it waits
    assert idle.got == [0, 1, 2, 3]
    assert [_get_here(channels, cid) for _ in range(2)] == [10, 11]


def test_a_waiting_consumer_gets_what_another_was_sent_ahead_first(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    idle, waiting = Consumer(), Consumer()
    channels.step(idle, Want(cid, 0, 0, 0, 4))
    channels.step(waiting, Want(cid, 0, 0, 0, 4))
    _put(channels, cid, range(10))
    assert (idle.got, waiting.got) == ([0, 1, 2, 3], [])  # ahead to one consumer at a time
    channels.step(waiting, Want(cid, 0, 0, 1, 4))  # one thread of it waits
    assert (waiting.got, idle.revoked) == ([], 1)
    channels.step(idle, Returned(cid, 0, 0, 0))  # it took none: 0..3 go to the
    # waiting one, 0 for its waiting thread, the rest ahead (the other has not waited since)
    assert (waiting.got, idle.got) == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_an_item_sent_for_a_waiting_thread_holds_nothing_back(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer = Consumer()
    channels.step(consumer, Want(cid, 0, 0, 0, 2))
    _put(channels, cid, range(4))
    assert consumer.got == [0, 1]
    assert _get_here(channels, cid) == EMPTY
    channels.step(consumer, Returned(cid, 0, 0, 0))  # 0 and 1 come back
    assert [_get_here(channels, cid) for _ in range(4)] == [0, 1, 2, 3]
    channels.step(consumer, Want(cid, 0, 2, 1, 1))  # a thread of it waits; it accepts 1
    _put(channels, cid, range(4, 6))
    assert consumer.got == [0, 1, 4]  # 4 for the waiting thread, none ahead
    assert _get_here(channels, cid) == 5


def test_what_a_consumer_keeps_for_its_waiting_threads_stays_with_it(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer = Consumer()
    channels.step(consumer, Want(cid, 0, 0, 0, 4))
    _put(channels, cid, range(6))
    assert _get_here(channels, cid) == EMPTY
    channels.step(consumer, Returned(cid, 0, 0, 1))  # keeps 0 (a thread of it waits)
    assert [_get_here(channels, cid) for _ in range(5)] == [1, 2, 3, 4, 5]
    assert channels.chans[cid].size() == 1  # 0, until it says it took it
    channels.step(consumer, Want(cid, 1, 4, 0, 4))
    assert channels.chans[cid].size() == 0


# ---------------------------------------------------------------- consumers with a tally page
# A consumer on this host counts what it takes in shared memory (`_tally`) and reports only
# now and then; here the test writes its page as its gets would.

tallied = pytest.mark.skipif(not _tally.available(), reason="needs memfd and /proc")


def _tallied(channels: Channels, cid: int, window: int) -> tuple[Consumer, _tally.TallyPage, int]:
    consumer, page = Consumer(), _tally.TallyPage()
    slot = page.slot()
    assert slot is not None
    channels.step(consumer, Tally(cid, slot, page.nonce, page.path))
    assert consumer.tallied == [cid]
    channels.step(consumer, Want(cid, 0, 0, 0, window))
    return consumer, page, slot


@tallied
def test_the_only_consumer_is_fed_ahead_and_its_quiet_takes_keep_the_window_open(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 4)
    assert consumer.fed == [True]  # it need not say when it waits
    _put(channels, cid, range(6))
    assert consumer.got == [0, 1, 2, 3]  # the window is full
    page.write(slot, 3)  # it took three, saying nothing
    assert channels.chans[cid].size() == 3
    _put(channels, cid, range(6, 7))
    assert consumer.got == [0, 1, 2, 3, 4, 5, 6]  # room for three more: sent
    page.write(slot, 7)  # it took them all
    other = Consumer()
    channels.step(other, Want(cid, 0, 0, 1, 4))  # a second consumer waits
    assert consumer.fed == [True, False]  # from now on it says when it waits
    assert (consumer.revoked, other.fed) == (0, [])
    _put(channels, cid, range(7, 9))
    # 7 for the waiting thread, then 8 ahead (nobody waits now), as before feeding
    assert (consumer.got[7:], other.got) == ([8], [7])
    page.close()


@tallied
def test_a_fed_consumer_holding_items_is_revoked_when_another_waits(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 4)
    _put(channels, cid, range(4))
    page.write(slot, 1)
    other = Consumer()
    channels.step(other, Want(cid, 0, 0, 1, 4))
    assert (consumer.revoked, consumer.fed) == (1, [True])  # a revoke ends feeding too
    channels.step(consumer, Returned(cid, 1, 0, 0))  # 1..3 come back, to the waiting one
    assert other.got == [1, 2, 3]
    assert consumer.fed == [True]  # idle since: not fed again until it waits
    page.close()


@tallied
def test_a_consumer_that_ends_after_quiet_takes_gives_back_exactly_the_rest(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 8)
    _put(channels, cid, range(10))
    assert consumer.got == list(range(8))
    page.write(slot, 5)
    channels.lost(consumer)  # its process ended
    assert [_get_here(channels, cid) for _ in range(5)] == [5, 6, 7, 8, 9]
    assert _get_here(channels, cid) == EMPTY
    page.close()


@tallied
def test_kept_items_taken_before_the_revoke_is_answered_come_back_once(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 4)
    _put(channels, cid, range(6))
    assert _get_here(channels, cid) == EMPTY  # 0..3 were sent ahead: revoked
    assert consumer.revoked == 1
    page.write(slot, 2)  # it took 0 and 1 (it keeps 1 for a waiting thread, then took it)
    channels.step(consumer, Returned(cid, 1, 0, 1))  # as it answered: took 1, keeps 1
    assert [_get_here(channels, cid) for _ in range(4)] == [2, 3, 4, 5]
    assert _get_here(channels, cid) == EMPTY
    assert channels.chans[cid].size() == 0
    page.close()


@tallied
def test_puts_to_a_busy_fed_consumer_go_in_batches_and_in_order(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 256)
    chan = channels.chans[cid]
    _put(channels, cid, range(1))
    assert consumer.frames == [1]  # it had taken everything: the put sends it at once
    with chan.cond:
        assert chan.deferrable()  # it has not taken 0: later items may wait for the feeder
    page.write(slot, 1)
    with chan.cond:
        assert not chan.deferrable()
    _put(channels, cid, range(1, 2))
    assert consumer.frames == [1, 1]
    _put(channels, cid, range(2, 200))  # it takes none of these meanwhile
    assert consumer.got == list(range(200))
    assert len(consumer.frames) < 12  # 198 items, in a few frames (at most 64 wait)
    assert chan.size() == 199  # all but the one it took, sent ahead and counted
    page.close()


@tallied
def test_a_fed_consumer_whose_window_keeps_items_here_is_fed_no_more(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, slot = _tallied(channels, cid, 2)
    assert consumer.fed == [True]
    _put(channels, cid, range(5))
    assert consumer.got == [0, 1]  # its window is full: 2..4 wait here
    assert consumer.fed == [True, False]  # so it says when it waits, or it would wait forever
    page.write(slot, 2)  # took both without a word; now a thread of it waits
    channels.step(consumer, Want(cid, 2, 2, 1, 2))
    assert consumer.got == [0, 1, 2, 3]  # 2 for the waiting thread, 3 ahead; 4 still waits
    assert consumer.fed == [True, False]
    page.write(slot, 4)
    channels.step(consumer, Want(cid, 4, 4, 1, 2))
    assert consumer.got == [0, 1, 2, 3, 4]
    assert consumer.fed == [True, False, True]  # nothing waits here any more: fed again
    page.close()


@tallied
def test_an_exit_waits_a_bounded_time_for_what_puts_left_to_the_feeder(
        queue: tuple[Channels, int]) -> None:
    channels, cid = queue
    consumer, page, _slot = _tallied(channels, cid, 256)
    _put(channels, cid, range(1))  # sent by the put itself; it has not taken it
    reading = threading.Event()
    send = consumer.send

    def stalled(frame: Frame) -> None:  # a consumer that stopped reading
        assert reading.wait(30)
        send(frame)

    consumer.send = stalled  # type: ignore[method-assign]
    channels.append(cid, pickle.dumps(1))  # left to the feeder thread, whose send stalls
    assert not channels.feeder.drain(0.2)  # an exit gives up after its timeout
    reading.set()
    assert channels.feeder.drain(10)
    assert consumer.got == [0, 1]
    page.close()
