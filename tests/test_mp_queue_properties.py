"""A queue's items, whatever the interleaving: each taken once, in the order put.

Hypothesis drives the broker's channels (`_channels.Channels`: `append`, `put`, `get`, and
`step` with what consumers send, `lost`) with consumer processes modelled as
`_stream.Stream` keeps its side of the protocol: threads that wait and say so (`Want`),
items sent ahead and taken later, revokes answered with what the waiting threads keep
(`Returned`), gets that give up and wait for the broker's word (`Settled`), and processes
that end with items at hand.
Frames travel each way in order but late: a revoke may cross a `Want`, a batch may arrive
after its consumer's thread gave up. A consumer counts its takes either in a real tally page
the broker maps (as on one host: it reports now and then, and the sole consumer of a queue
its creator does not read is fed ahead and waits without a word) or in a report per take
(as elsewhere). What puts leave to the broker's feeder goes out at a step of its own.

A bounded queue never holds more than its size (what the broker has not heard was taken
counts as there). At the end every item put was taken exactly once, and:

* as the stdlib's queue, a get that began after another get returned an item returns a
  later one (two gets that overlap may return in either order);
* in the order of the hand-outs that stood (a batch sent ahead and handed back does not
  count; what was kept for a waiting thread does), the items come in the order put: nobody
  was handed an item while an earlier one, sent ahead elsewhere, was neither taken nor
  handed back.

Items a consumer held when its process ended go back to the queue's front, after what others
took meanwhile: neither order holds for them (the stdlib's queue would lose them).
"""

from __future__ import annotations

import itertools
import pickle
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fiberexec.multiprocessing._channels import EMPTY, FULL, OK, Chan, Channels, Feeder, Wait
from fiberexec.multiprocessing._frames import (
    Feed,
    Frame,
    Items,
    Returned,
    Revoke,
    Settled,
    Tallied,
    Tally,
    Want,
)
from fiberexec.multiprocessing._tally import TallyPage, TallyView

CONSUMERS = 3
REPORT = 2  # a tallied consumer's takes between its reports (`_stream.REPORT`)


class StepFeeder(Feeder):
    """The broker's `Feeder` with no thread: what puts leave to it waits for `flush`, a
    step of its own."""

    def schedule(self, chan: Chan) -> None:
        with self.cond:
            self.chans.append(chan)


@dataclass
class Thread:
    """A consumer's thread waiting in ``get()``."""

    began: int  # when its get began
    settle: int = 0  # the `Settled` it waits for once it gave up; 0 while it waits on
    silent: bool = False  # it waits without having said so: its consumer is fed ahead


@dataclass(frozen=True)
class Take:
    item: int
    began: int  # when the get began
    ended: int  # when it returned the item


class ConsumerProcess:
    """A consumer process's stream and its one queue's lane, as `_stream.Stream` keeps
    them (its `_Lane`, `get`, `_wait_item`, `_settle`, `_take`, `_revoked`), with its
    frames held in flight. A ``tallied`` one counts its takes in a real tally page the
    broker maps (`_tally`, as on one host), and may be fed ahead (`Feed`)."""

    def __init__(self, cid: int, window: int, clock: Iterator[int],
                 handed: Callable[[bytes], None], tallied: bool) -> None:
        self.cid = cid
        self.window = window
        self.clock = clock
        self.handed = handed  # told of each item the broker sends, as it sends it
        # what `_hub.Peer` carries for the broker
        self.inlet = ""
        self.gone = self.ended = False
        self.holder: str | None = None
        self.tally: TallyView | None = None  # the broker maps the page it announced
        self.slots: dict[int, int] = {}
        self.inbox: deque[Frame] = deque()  # the broker's frames, not yet read
        self.outbox: deque[Frame] = deque()  # ours, not yet read by the broker
        self.items: deque[bytes] = deque()  # at hand
        self.received = self.consumed = 0
        self.threads: list[Thread] = []  # waiting in get()
        self.settle = self.settled = 0
        self.took: list[Take] = []
        self.alive = True
        self.told = 0  # ``consumed`` when the broker was last told
        self.tallied = self.fed = False  # the broker reads its page; it is fed ahead
        self.page = TallyPage() if tallied else None
        self.slot: int | None = None
        if self.page is not None:  # announced before its first `Want` (`Stream._announce`)
            self.slot = self.page.slot()
            assert self.slot is not None
            self.outbox.append(Tally(cid, self.slot, self.page.nonce, self.page.path))

    # the broker's end of the stream (`_hub.Peer.send`)
    def send(self, frame: Frame) -> None:
        assert self.alive, f"{frame!r} was sent to a consumer whose stream ended"
        assert isinstance(frame, (Items, Revoke, Settled, Tallied, Feed)), (
            f"a consumer was sent {frame!r}")
        self.inbox.append(frame)
        if isinstance(frame, Items):
            for item in frame.items:
                self.handed(item)

    def close(self) -> None:
        """Its page, and the broker's view of it, go with its process."""
        for mapped in (self.tally, self.page):
            if mapped is not None:
                mapped.close()
        self.tally = self.page = None

    def _wanted(self, at_hand: int) -> int:
        settling = sum(1 for thread in self.threads if thread.settle)
        return max(0, len(self.threads) - settling - at_hand)

    def _tell(self, settle: int = 0) -> None:
        self.told = self.consumed
        self.outbox.append(Want(self.cid, self.consumed, self.received,
                                self._wanted(len(self.items)), self.window, settle))

    def _take(self, began: int) -> None:
        item = self.items.popleft()
        self.consumed += 1
        if self.page is not None and self.slot is not None:
            self.page.write(self.slot, self.consumed)  # before the item is returned
        self.took.append(Take(pickle.loads(item), began, next(self.clock)))
        if not self.tallied or self.consumed - self.told >= REPORT:
            self._tell()

    def _speak_up(self) -> None:
        """Threads that waited silently, fed ahead, are fed no more: they say they wait."""
        silent = [thread for thread in self.threads if thread.silent]
        if silent and not self.fed:
            for thread in silent:
                thread.silent = False
            self._tell()

    def get(self) -> None:
        """A thread calls ``get()``: it takes what is at hand, or waits and says so.

        Threads of one process are alike to the broker: one that comes while others wait
        may take what came for them (as the first of them would have) and wait in its
        place."""
        thread = Thread(next(self.clock), silent=self.fed)
        if self.items:
            self._take(self._first(thread))
        else:
            self.threads.append(thread)
            if not thread.silent:
                self._tell()

    def _first(self, thread: Thread) -> int:
        """When the get ``thread`` takes for began: the earliest of those waiting, if one
        began before it (``thread`` waits on in its place)."""
        first = min(self.threads, key=lambda waiting: waiting.began, default=thread)
        if first.began < thread.began:
            first.began, thread.began = thread.began, first.began
        return thread.began

    def wake(self, settling_first: bool) -> None:
        """A waiting thread moves on: it takes what arrived (one that gave up, if
        ``settling_first`` and there is one, says so after), or returns empty-handed once
        the broker's word came, or gives up waiting and asks for that word. Among threads
        alike, the one that began first goes (the order least likely to look wrong)."""
        plain = [thread for thread in self.threads if not thread.settle]
        settling = [thread for thread in self.threads if thread.settle]
        answered = [thread for thread in settling if thread.settle <= self.settled]
        if self.items:
            gave_up = bool(settling) and (settling_first or not plain)
            thread = (settling if gave_up else plain)[0]
            self.threads.remove(thread)
            self._take(self._first(thread))
            if gave_up:
                self._tell()
        elif answered:
            self.threads.remove(answered[0])
        elif plain:
            self.settle += 1
            plain[-1].settle = self.settle
            plain[-1].silent = False
            self._tell(self.settle)

    def read(self) -> list[bytes]:
        """Read the broker's next frame; the items it hands back if it was a revoke."""
        match self.inbox.popleft():
            case Items(_cid, items):
                self.items.extend(items)
                self.received += len(items)
                return []
            case Revoke(cid):
                kept = min(len(self.threads), len(self.items))
                back = list(self.items)[kept:]
                self.items = deque(list(self.items)[:kept])
                self.outbox.append(Returned(cid, self.consumed, self._wanted(kept), kept))
                self.fed = False
                self._speak_up()
                return back
            case Settled(_cid, settle):
                self.settled = max(self.settled, settle)
                return []
            case Tallied():
                self.tallied = True
                return []
            case Feed(_cid, on):
                self.fed = on
                self._speak_up()
                return []
            case frame:
                raise AssertionError(f"a consumer was sent {frame!r}")


class Observed(Channels):
    """The broker's channels, which tell the test after each `settle` (where calls that
    wait are answered) and before each item is added (whose hand-outs may follow a get's
    answer in the same settle), so that it sees each answer in its place."""

    def __init__(self, settled: Callable[[], None], clock: Callable[[], float]) -> None:
        super().__init__(clock=clock, feeder=StepFeeder())
        self.settled = settled

    def settle(self, chan: Chan) -> None:
        super().settle(chan)
        self.settled()

    def _append(self, chan: Chan, body: bytes) -> None:
        self.settled()
        super()._append(chan, body)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0  # the broker's clock
        self.channels = Observed(self._answered, lambda: self.now)
        self.cid = self.channels.new(0, -1)
        self.consumers: list[ConsumerProcess] = []
        self.put = 0  # items numbered (each put, or begun, with the next number)
        self.refused: set[int] = set()  # those whose put found the queue full
        self.gets_waiting: list[tuple[int, Wait]] = []  # gets here: when each began
        self.puts_waiting: list[tuple[int, Wait]] = []  # puts for room: the item of each
        self.clock = itertools.count()
        self.taken_here: list[Take] = []
        self.handed: dict[int, int] = {}  # item -> when the hand-out that stands was made
        self.requeued: set[int] = set()  # items a consumer held when its process ended
        self.creator_gets = True
        self.maxsize = 0

    def _answered(self) -> None:
        """Record the calls waiting here that the broker just answered."""
        for began, get in [(b, g) for b, g in self.gets_waiting if g.status]:
            self.gets_waiting.remove((began, get))
            if get.status == OK:
                item = pickle.loads(get.body)
                self.handed[item] = next(self.clock)
                self.taken_here.append(Take(item, began, next(self.clock)))
            else:
                assert get.status == EMPTY
        for item, put in [(i, p) for i, p in self.puts_waiting if p.status]:
            self.puts_waiting.remove((item, put))
            if put.status != OK:
                assert put.status == FULL
                self.refused.add(item)

    def _hand(self, item: bytes) -> None:
        self.handed[pickle.loads(item)] = next(self.clock)

    def _live(self, having: Callable[[ConsumerProcess], object] = bool) -> list[ConsumerProcess]:
        return [c for c in self.consumers if c.alive and having(c)]

    def _pick(self, index: int, having: Callable[[ConsumerProcess], object] = bool,
              ) -> ConsumerProcess:
        live = self._live(having)
        return live[index % len(live)]

    @initialize(window=st.integers(1, 4), tallied=st.booleans(), creator_gets=st.booleans(),
                maxsize=st.sampled_from([0, 0, 1, 3]))
    def first_consumer(self, window: int, tallied: bool, creator_gets: bool,
                       maxsize: int) -> None:
        """The queue (bounded or not) and its first consumer; and whether the queue's
        creator takes items too (if not, a sole consumer on this host is fed ahead)."""
        self.creator_gets = creator_gets
        self.maxsize = maxsize
        self.cid = self.channels.new(maxsize, -1)
        self.start_consumer(window, tallied)

    @precondition(lambda self: len(self._live()) < CONSUMERS)
    @rule(window=st.integers(1, 4), tallied=st.booleans())
    def start_consumer(self, window: int, tallied: bool) -> None:
        self.consumers.append(ConsumerProcess(self.cid, window, self.clock, self._hand, tallied))

    @rule(n=st.integers(1, 5))
    def put_items(self, n: int) -> None:
        """Puts from elsewhere (`Put` frames) or, on a bounded queue, puts that do not wait
        for room (`calls.Put`), until one finds it full."""
        for _ in range(n):
            item = pickle.dumps(self.put)
            if not self.maxsize:
                self.channels.append(self.cid, item)
            elif self.channels.put(item, self.cid, 0.0) != OK:
                break
            self.put += 1

    @precondition(lambda self: self.maxsize)
    @rule(seconds=st.integers(1, 3))
    def put_waits_for_room(self, seconds: int) -> None:
        """A put into the bounded queue that waits up to ``seconds`` for room."""
        item = self.put
        self.put += 1
        self.puts_waiting.append(
            (item, self.channels.begin_put(pickle.dumps(item), self.cid, seconds)))
        self._answered()  # (if it was answered at once)

    @precondition(lambda self: self.creator_gets)
    @rule(seconds=st.integers(1, 3))
    def get_waits_here(self, seconds: int) -> None:
        """A thread here calls ``get(timeout=seconds)``."""
        self.gets_waiting.append((next(self.clock), self.channels.begin_get(self.cid, seconds)))
        self._answered()

    @precondition(lambda self: self.gets_waiting or self.puts_waiting)
    @rule(seconds=st.integers(1, 2))
    def time_passes(self, seconds: int) -> None:
        """The clock moves on; a waiting thread wakes and settles the queue."""
        self.now += seconds
        with self.channels.turn(self.cid):
            pass

    @precondition(lambda self: self.channels.feeder.chans)
    @rule()
    def feeder_sends(self) -> None:
        self.channels.feeder.flush()

    def _get_here(self) -> bool:
        began = next(self.clock)
        status, body = self.channels.get(self.cid, 0.0)
        if status == OK:
            item = pickle.loads(body)
            self.handed[item] = next(self.clock)
            self.taken_here.append(Take(item, began, next(self.clock)))
        else:
            assert status == EMPTY
        return status == OK

    @precondition(lambda self: self.creator_gets)
    @rule()
    def get_here(self) -> None:
        self._get_here()

    @precondition(lambda self: self._live())
    @rule(index=st.integers(0, CONSUMERS - 1))
    def consumer_gets(self, index: int) -> None:
        self._pick(index).get()

    @precondition(lambda self: self._live(lambda c: c.threads))
    @rule(index=st.integers(0, CONSUMERS - 1), settling_first=st.booleans())
    def waiting_thread_moves_on(self, index: int, settling_first: bool) -> None:
        self._pick(index, lambda c: c.threads).wake(settling_first)

    @precondition(lambda self: self._live(lambda c: c.inbox))
    @rule(index=st.integers(0, CONSUMERS - 1))
    def consumer_reads(self, index: int) -> None:
        self._read(self._pick(index, lambda c: c.inbox))

    def _read(self, consumer: ConsumerProcess) -> None:
        for item in consumer.read():
            del self.handed[pickle.loads(item)]  # handed back: it does not stand

    def _deliver(self, consumer: ConsumerProcess) -> None:
        self.channels.step(consumer, consumer.outbox.popleft())  # type: ignore[arg-type]

    @precondition(lambda self: self._live(lambda c: c.outbox))
    @rule(index=st.integers(0, CONSUMERS - 1))
    def broker_reads(self, index: int) -> None:
        self._deliver(self._pick(index, lambda c: c.outbox))

    @precondition(lambda self: self._live())
    @rule(index=st.integers(0, CONSUMERS - 1))
    def consumer_ends(self, index: int) -> None:
        self._end(self._pick(index))

    def _end(self, consumer: ConsumerProcess) -> None:
        """Its process ends: the broker reads what it sent, then its stream closes; what
        was on its way to it and what it had at hand go back."""
        while consumer.outbox:
            self._deliver(consumer)
        consumer.alive = False
        unread = [item for frame in consumer.inbox if isinstance(frame, Items)
                  for item in frame.items]
        for item in [*consumer.items, *unread]:
            del self.handed[pickle.loads(item)]
            self.requeued.add(pickle.loads(item))
        consumer.items.clear()
        consumer.inbox.clear()
        consumer.ended = True
        self.channels.lost(consumer)  # type: ignore[arg-type]
        consumer.close()

    def _takes(self) -> list[Take]:
        return self.taken_here + [take for c in self.consumers for take in c.took]

    @invariant()
    def a_bounded_queue_holds_no_more_than_its_size(self) -> None:
        if self.maxsize:  # (the broker counts what it has not heard was taken as there)
            entered = self.put - len(self.refused) - len(self.puts_waiting)
            assert entered - len(self._takes()) <= self.maxsize

    @invariant()
    def a_get_that_began_later_takes_a_later_item(self) -> None:
        takes = [take for take in self._takes() if take.item not in self.requeued]
        for later in takes:
            before = [take.item for take in takes if take.ended < later.began]
            assert not before or max(before) < later.item, (
                f"a get that began after {max(before)} was taken returned {later.item}")

    def teardown(self) -> None:
        try:
            # let every call here end, every frame land and every waiting thread go, then
            # end the consumers (what they hold goes back) and take the rest here
            self.now += 10
            with self.channels.turn(self.cid):
                pass
            assert not (self.gets_waiting or self.puts_waiting), "a call past its deadline waits"
            for consumer in self.consumers:
                self.channels.feeder.flush()
                for _ in range(10_000):
                    if not (consumer.alive and (consumer.inbox or consumer.outbox
                                                or consumer.threads)):
                        break
                    if consumer.inbox:
                        self._read(consumer)
                    elif consumer.outbox:
                        self._deliver(consumer)
                    else:
                        consumer.wake(settling_first=False)
                else:
                    raise AssertionError(f"threads still wait, all frames read: {consumer}")
                if consumer.alive:
                    self._end(consumer)
            self.channels.feeder.flush()
            while self._get_here():
                pass
            took = sorted(take.item for take in self._takes())
            assert took == sorted(set(range(self.put)) - self.refused), (
                "an item lost or taken twice")
            self.a_get_that_began_later_takes_a_later_item()
            order = [item for item in sorted(self.handed, key=self.handed.__getitem__)
                     if item not in self.requeued]
            assert order == sorted(order), f"hand-outs out of order: {order}"
        finally:
            for consumer in self.consumers:
                consumer.close()


def test_a_get_that_gives_up_takes_what_was_sent_for_it() -> None:
    """The race the property found: a consumer's thread waits, the broker sends it item
    0, and the thread gives up before 0 arrives; a get here then takes 1. The stdlib's get
    that read 0 returns it, so the thread that gave up takes 0 when it comes (it waits for
    the broker's `Settled`), and no later get of that consumer returns 0 after 1."""
    machine = QueueMachine()
    try:
        machine.put_items(2)
        machine.start_consumer(window=1, tallied=False)
        machine.consumer_gets(0)  # its thread waits: Want(wanted=1)
        machine.broker_reads(0)  # 0 goes to it, for that thread
        machine.waiting_thread_moves_on(0, settling_first=False)  # it gives up
        assert machine._get_here() and machine.taken_here[-1].item == 1
        machine.consumer_reads(0)  # 0 arrives
        machine.waiting_thread_moves_on(0, settling_first=False)
        (consumer,) = machine.consumers
        assert [take.item for take in consumer.took] == [0] and not consumer.threads
        machine.a_get_that_began_later_takes_a_later_item()
    finally:
        machine.teardown()


QueueMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=60,
                                          deadline=None)
TestQueueProperties = QueueMachine.TestCase
