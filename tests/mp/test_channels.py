"""The broker's queues and pipes driven one step at a time: a fake clock, no thread, no socket.

Each process that talks to the broker is a real `_hub.Peer` over an in-memory link
(`tests/support/sockets.py`) that nobody serves: the test feeds what the process would send
to `Channels.step` itself and reads back, off the other end, what the broker sent it. Calls
that wait (a get for an item, a put for room) are begun without blocking (`begin_get`,
`begin_put`), and the test moves the clock to end them.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._channels import EMPTY, EOF, FULL, OK, Channels, Feeder, Wait
from fiberexec.multiprocessing._frames import (
    Claim,
    Count,
    Counted,
    Done,
    Eof,
    Frame,
    Holder,
    Item,
    Items,
    Put,
    Release,
    Returned,
    Revoke,
    Subscribe,
    Want,
    decode,
)
from fiberexec.multiprocessing._hub import Peer
from fiberexec.multiprocessing._links import Wire
from tests.support.clock import FakeClock
from tests.support.sockets import MemorySocket, memory_pair


class Process:
    """A process with a stream to the broker: the broker's `Peer` for it, and its own end."""

    def __init__(self, channels: Channels) -> None:
        ours, theirs = memory_pair()
        self.sockets: tuple[MemorySocket, MemorySocket] = (ours, theirs)
        self.peer = Peer(Wire(ours), channels.step, channels.lost)  # type: ignore[arg-type]
        self.end = Wire(theirs)  # type: ignore[arg-type]
        self.channels = channels

    def says(self, frame: Frame) -> None:
        """The broker reads ``frame`` off this process's stream."""
        self.channels.step(self.peer, frame)

    def awaits(self) -> Frame:
        """The next frame the broker sends this process (from a thread of the test)."""
        assert self.end.poll(10), "the broker sent nothing"
        return decode(self.end.recv_bytes())

    def heard(self) -> list[Frame]:
        """What the broker sent this process since it last looked."""
        frames = []
        while self.end.poll(0):
            frames.append(decode(self.end.recv_bytes()))
        return frames

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


class StepFeeder(Feeder):
    """No thread: what a put leaves to the feeder is sent at `flush`."""

    def schedule(self, chan: object) -> None:
        with self.cond:
            self.chans.append(chan)  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def channels(clock: FakeClock) -> Channels:
    return Channels(clock=clock, feeder=StepFeeder())


@pytest.fixture
def processes(channels: Channels) -> Iterator[list[Process]]:
    made = [Process(channels) for _ in range(2)]
    yield made
    for process in made:
        process.close()


def _later(channels: Channels, clock: FakeClock, cid: int, seconds: float) -> None:
    """Time passes; the channel is settled, as a waiting thread does when it wakes."""
    clock.advance(seconds)
    with channels.turn(cid):
        pass


def _item(n: int) -> bytes:
    return pickle.dumps(n)


def test_a_waiting_get_takes_the_item_a_process_puts(
        channels: Channels, processes: list[Process]) -> None:
    cid = channels.new(0, -1)
    get = channels.begin_get(cid, 5.0)
    assert get.status == ""
    processes[0].says(Put(cid, _item(1)))
    assert (get.status, get.body) == (OK, _item(1))
    assert channels.chan(cid).size() == 0


def test_gets_that_wait_are_answered_in_the_order_they_came(
        channels: Channels, processes: list[Process]) -> None:
    cid = channels.new(0, -1)
    gets = [channels.begin_get(cid, 5.0) for _ in range(3)]
    for n in range(3):
        processes[0].says(Put(cid, _item(n)))
    assert [pickle.loads(get.body) for get in gets] == [0, 1, 2]


def test_a_get_ends_empty_when_its_deadline_passes_on_the_clock(
        channels: Channels, clock: FakeClock, processes: list[Process]) -> None:
    cid = channels.new(0, -1)
    get = channels.begin_get(cid, 5.0)
    _later(channels, clock, cid, 4.9)
    assert get.status == ""
    _later(channels, clock, cid, 0.2)
    assert get.status == EMPTY
    processes[0].says(Put(cid, _item(7)))  # what comes after stays for the next get
    assert channels.begin_get(cid, 0.0).body == _item(7)


def test_a_get_that_does_not_wait_is_answered_at_once(channels: Channels) -> None:
    cid = channels.new(0, -1)
    assert channels.begin_get(cid, 0.0).status == EMPTY
    channels.append(cid, _item(1))
    get = channels.begin_get(cid, 0.0)
    assert (get.status, get.body) == (OK, _item(1))


def test_a_put_into_a_full_queue_waits_for_room_and_keeps_its_place(
        channels: Channels, clock: FakeClock) -> None:
    cid = channels.new(1, -1)
    assert channels.begin_put(_item(0), cid, 0.0).status == OK
    first, second = channels.begin_put(_item(1), cid, 5.0), channels.begin_put(_item(2), cid, 5.0)
    assert (first.status, second.status) == ("", "")
    assert channels.begin_get(cid, 0.0).body == _item(0)  # room for one: the first put's
    assert (first.status, second.status) == (OK, "")
    _later(channels, clock, cid, 5.0)
    assert second.status == FULL  # its item was never put
    assert channels.begin_get(cid, 0.0).body == _item(1)
    assert channels.begin_get(cid, 0.0).status == EMPTY


def test_a_put_for_room_waits_until_a_consumer_elsewhere_says_it_took_an_item(
        channels: Channels, processes: list[Process]) -> None:
    consumer = processes[0]
    cid = channels.new(1, -1)
    consumer.says(Want(cid, 0, 0, 1, 1))  # a thread of it waits; it accepts 1 ahead
    assert channels.begin_put(_item(0), cid, 0.0).status == OK
    assert consumer.heard() == [Items(cid, (_item(0),))]
    put = channels.begin_put(_item(1), cid, 5.0)
    assert put.status == ""  # 0 is on its way, not taken: the queue is full
    consumer.says(Want(cid, 1, 1, 0, 1))  # it took 0
    assert put.status == OK
    assert consumer.heard() == [Items(cid, (_item(1),))]  # sent ahead: nothing waits here


def test_a_get_here_has_items_sent_ahead_elsewhere_handed_back_first(
        channels: Channels, processes: list[Process]) -> None:
    consumer = processes[0]
    cid = channels.new(0, -1)
    consumer.says(Want(cid, 0, 0, 0, 4))  # it waits for nothing; it accepts 4 ahead
    for n in range(6):
        channels.append(cid, _item(n))
    channels.feeder.flush()
    assert [item for frame in consumer.heard() if isinstance(frame, Items)
            for item in frame.items] == [_item(n) for n in range(4)]
    get = channels.begin_get(cid, 5.0)
    assert get.status == ""  # 4 is here, but 0..3 come first
    assert consumer.heard() == [Revoke(cid)]
    consumer.says(Returned(cid, 1, 0, 0))  # it took 0; 1..3 come back
    assert (get.status, pickle.loads(get.body)) == (OK, 1)
    assert [pickle.loads(channels.begin_get(cid, 0.0).body) for _ in range(4)] == [2, 3, 4, 5]


def test_what_a_process_held_goes_to_the_get_waiting_here_when_it_ends(
        channels: Channels, processes: list[Process]) -> None:
    consumer = processes[0]
    cid = channels.new(0, -1)
    consumer.says(Want(cid, 0, 0, 1, 1))
    channels.append(cid, _item(0))
    assert consumer.heard() == [Items(cid, (_item(0),))]
    get = channels.begin_get(cid, 5.0)
    channels.lost(consumer.peer)  # its process ended without taking 0
    assert (get.status, get.body) == (OK, _item(0))
    assert channels.chan(cid).leases == {}


def test_a_get_on_a_pipe_ends_at_eof_once_its_last_writer_closes(
        channels: Channels, processes: list[Process]) -> None:
    writer = processes[0]
    cid = channels.new(0, 1)  # a pipe direction, with its creator's end
    writer.says(Holder("writer-token"))
    writer.says(Claim(cid, "ticket"))  # the writer unpickled a copy of the end: 2 now
    get = channels.begin_get(cid, 5.0)
    writer.says(Put(cid, _item(1)))
    assert get.body == _item(1)
    channels.unref(cid, "")  # the creator closes its copy
    get = channels.begin_get(cid, 5.0)
    assert get.status == ""
    writer.says(Release(cid))  # the writer closes its copy: no writer is left
    assert get.status == EOF


def test_a_subscribed_reader_is_pushed_items_and_eof(
        channels: Channels, processes: list[Process]) -> None:
    reader = processes[1]
    cid = channels.new(0, 1)
    channels.append(cid, _item(0))
    reader.says(Subscribe(cid))
    channels.append(cid, _item(1))
    channels.unref(cid, "")
    assert reader.heard() == [Item(cid, _item(0)), Item(cid, _item(1)), Eof(cid)]


def test_a_stream_that_ends_releases_the_pipe_ends_its_process_held(
        channels: Channels, processes: list[Process]) -> None:
    writer = processes[0]
    cid = channels.new(0, 1)
    writer.says(Holder("writer-token"))
    writer.says(Claim(cid, "ticket"))
    channels.unref(cid, "")  # the creator's copy is closed; the writer's is open
    get = channels.begin_get(cid, 5.0)
    channels.lost(writer.peer)  # its process died without closing it
    assert get.status == EOF


def test_a_frame_no_process_sends_is_refused(
        channels: Channels, processes: list[Process]) -> None:
    cid = channels.new(0, -1)
    with pytest.raises(ValueError, match="never expects"):
        processes[0].says(Item(cid, b"x"))


def test_a_wait_is_answered_once(channels: Channels, clock: FakeClock) -> None:
    """An answered call stays as it was answered, whatever comes later."""
    cid = channels.new(0, -1)
    get = channels.begin_get(cid, 1.0)
    channels.append(cid, _item(1))
    _later(channels, clock, cid, 2.0)
    assert (get.status, get.body) == (OK, _item(1))
    assert isinstance(get, Wait)


def _in_thread(call: Callable[[], Any]) -> Callable[[], Any]:
    """Run a call that blocks in a thread of its own; what returns its result once it
    returned (within 10 s)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()

    def outcome() -> Any:
        thread.join(10)
        assert not thread.is_alive(), "the call still waits"
        return result[0]

    return outcome


def _consumer_holding(channels: Channels, consumer: Process, n: int) -> int:
    """A queue whose consumer elsewhere was sent ``n`` items ahead (and took none)."""
    cid = channels.new(0, -1)
    consumer.says(Want(cid, 0, 0, 0, n))
    for i in range(n + 2):  # two more than its window: they stay here
        channels.append(cid, _item(i))
    channels.feeder.flush()
    assert sum(len(f.items) for f in consumer.heard() if isinstance(f, Items)) == n
    return cid


def test_qsize_asks_a_consumer_elsewhere_what_it_took_and_counts_by_its_answer(
        channels: Channels, processes: list[Process]) -> None:
    consumer = processes[0]
    cid = _consumer_holding(channels, consumer, 4)
    qsize = _in_thread(lambda: channels.qsize(cid))
    assert consumer.awaits() == Count(cid, 1)
    consumer.says(Want(cid, 3, 4, 0, 4))  # it took 3 of the 4 (its report comes first)
    consumer.says(Counted(cid, 1, 0))
    assert qsize() == (1 + 2, 0)


def test_qsize_counts_without_an_answer_once_its_wait_passes_on_the_clock(
        channels: Channels, clock: FakeClock, processes: list[Process]) -> None:
    consumer = processes[0]
    cid = _consumer_holding(channels, consumer, 4)
    qsize = _in_thread(lambda: channels.qsize(cid))
    assert consumer.awaits() == Count(cid, 1)  # it never answers
    _later(channels, clock, cid, _timing.TIMING.count)
    assert qsize() == (4 + 2, 0)  # what was sent to it counts as there


def test_a_join_ends_when_a_process_marks_the_last_item_done_on_its_stream(
        channels: Channels, processes: list[Process]) -> None:
    cid = channels.new(0, -1)
    channels.append(cid, _item(0))
    channels.append(cid, _item(1))
    assert channels.begin_get(cid, 0.0).status == OK  # this process takes one
    channels.task_done(cid)
    join = _in_thread(lambda: channels.join(cid, 10.0))
    processes[0].says(Done(cid))  # the other was taken elsewhere, and marked done there
    assert join() is True
    assert channels.chan(cid).unfinished == 0


def test_a_mark_on_a_stream_beyond_the_items_put_changes_nothing(
        channels: Channels, processes: list[Process], caplog: pytest.LogCaptureFixture) -> None:
    cid = channels.new(0, -1)
    processes[0].says(Done(cid))
    assert channels.chan(cid).unfinished == 0
    assert "more times than items were put" in caplog.text


def test_a_mark_asked_of_the_broker_counts_the_marks_its_process_streamed_first(
        channels: Channels, processes: list[Process]) -> None:
    """A process marks on its stream what it took (`Done`), and asks the broker for a mark
    beyond those: the call, on another connection, must not overtake them."""
    consumer = processes[0]
    consumer.says(Holder("consumer-token"))
    cid = channels.new(0, -1)
    channels.append(cid, _item(0))  # taken by the consumer, who marks it on its stream...

    def extra_mark() -> str:
        try:
            channels.task_done(cid, "consumer-token", 1)  # ... then marks once more
        except ValueError as exc:
            return str(exc)
        return "no error"

    told = _in_thread(extra_mark)
    consumer.says(Done(cid))
    assert told() == "task_done() called too many times"
    assert channels.chan(cid).unfinished == 0
