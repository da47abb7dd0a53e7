"""The state of this process's queues and pipe channels, changed one step at a time.

`Channels.step` applies one frame from another process's stream (`_hub`); calls of `_rpc`
and of threads here come in through the methods beside it. Each change is made under its
channel's condition, and ends with `Channels.settle`: the calls waiting on that channel
(`Wait`: a get for an item, a put for room, a poll, a join, a ``qsize()`` waiting for the
counts it asked for) that can now be answered are (gets and puts in the order they came),
and those whose deadline passed on the channels' clock are answered empty (or full). A
thread whose call waits blocks on the condition until its `Wait` is answered, and settles
the channel again when it wakes: the clock decides when a wait ends. (A pipe end read here
waits in `Chan.await_item` instead, reading its writer's stream itself.) So every decision
here can be driven without a socket: fake peers, a fake clock, one step at a time
(`tests/mp/test_channels.py`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fiberexec.multiprocessing import _tally, _timing
from fiberexec.multiprocessing._cond import Condition
from fiberexec.multiprocessing._frames import (
    Claim,
    Count,
    Counted,
    Done,
    Eof,
    Feed,
    Flush,
    Flushed,
    Frame,
    Holder,
    InletAt,
    Item,
    Items,
    Put,
    Release,
    Returned,
    Revoke,
    Settled,
    Subscribe,
    Tallied,
    Tally,
    Unroute,
    Unsubscribe,
    Want,
    unexpected,
)
from fiberexec.multiprocessing._hub import Peer
from fiberexec.multiprocessing._links import Signal, Wake, thread_wake
from fiberexec.multiprocessing._rpc import caller_gone, caller_waits

log = logging.getLogger("fiberexec.multiprocessing")

OK, EMPTY, FULL, EOF = "ok", "empty", "full", "eof"
LEASE_BYTES = 1 << 20  # a consumer that is not waiting is sent items up to this many bytes
FEED_BATCH = 64  # queue items a put leaves to the `Feeder` before it sends them itself


OK, EMPTY, FULL, EOF = "ok", "empty", "full", "eof"
SHARED_HEADER = 16  # bytes before a shared value's data (see `_sharedctypes`)
LEASE_BYTES = 1 << 20  # a consumer that is not waiting is sent items up to this many bytes
FEED_BATCH = 64  # queue items a put leaves to the `Feeder` before it sends them itself


@dataclass
class Lease:
    """Queue items sent ahead to one consumer process (see `_stream.Stream`).

    Items stay here (in ``outstanding``) until the consumer says it took them, so they can
    be taken back (revoked) for a consumer that waits while they sit unread elsewhere, and
    go back to the queue if the consumer's process ends.

    Items sent ahead (no thread of the consumer waited for them) are earlier than every
    item still here: while the consumer has not taken them, no one else may take a later
    one (see `Chan.dispatch`).
    """

    peer: Peer
    window: int = 0  # items the consumer accepts ahead of its gets
    wanted: int = 0  # its threads waiting in get() for which nothing is on the way
    sent: int = 0  # items sent in total
    consumed: int = 0  # items it reported taken in total
    outstanding: deque[bytes] = field(default_factory=deque)  # sent, not reported taken
    nbytes: int = 0  # their size
    revoking: bool = False  # asked to hand back what it has not taken; nothing is sent
    gone: bool = False  # sending to it failed: nothing more is sent; its stream is ending
    direct: int = 0  # items producers sent it directly (`_route`) that it had not taken
    asked: int = 0  # the last count of those asked for (see `Chan.ask_held`)
    answered: int = 0  # the last count answered
    ahead_until: int = 0  # ``consumed`` once the items sent ahead last are taken
    idle: bool = False  # was revoked and has not waited since: nothing is sent ahead to it
    # (an idle consumer would only have them revoked again, one round trip per get elsewhere)
    slot: int | None = None  # where its count of items taken is, in its peer's tally page
    fed: bool = False  # told it is fed ahead: it no longer says when it waits (`Chan.refeed`)

    def sync(self) -> None:
        """Learn from the consumer's tally page (`_tally`) what it took since it last said."""
        tally = self.peer.tally
        if self.slot is not None and tally is not None:  # a slot is given with the page
            count = tally.read(self.slot)
            if count is not None and count > self.consumed:
                self.taken(min(count, self.sent))

    def taken(self, consumed: int) -> None:
        for _ in range(min(consumed - self.consumed, len(self.outstanding))):
            self.nbytes -= len(self.outstanding.popleft())
        self.consumed = max(self.consumed, consumed)

    def holds_ahead(self) -> bool:
        """Whether items sent ahead to this consumer are neither taken nor handed back
        (it takes in the order sent, so those sent ahead last are taken last); call
        `sync` first."""
        return bool(self.outstanding) and self.consumed < self.ahead_until


@dataclass(eq=False)
class Mark:
    """A queue's flush waiting to be answered (see `Channels._flush`): ``peer`` is told with
    ``nonce`` once the ``left`` items that were here at the flush are sent to it."""

    peer: Peer
    nonce: bytes
    left: int


@dataclass(eq=False)
class Wait:
    """A call waiting in a channel: a get for an item, a put into a full queue for room, or
    a watch (``until``: a poll for an item, a join for every task done, a ``qsize()`` for
    the counts it asked consumers elsewhere for).

    It is answered by the step that can answer it (gets and puts in the order they came):
    ``status`` `OK`, and a get's ``body`` its item; `EOF` for a get once no writer is left.
    Once ``deadline`` passes on the channels' clock, it is answered `FULL` if a put, else
    `EMPTY`."""

    deadline: float  # on the channels' clock
    body: bytes = b""  # a put's item; a get's, once answered
    status: str = ""  # "" while it waits
    until: Callable[[], bool] | None = None  # a watch: answered once this is true


@dataclass
class Chan:
    """One FIFO of pickled items (a queue, or one direction of a pipe)."""

    maxsize: int = 0
    items: deque[bytes] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=Condition)
    unfinished: int = 0  # JoinableQueue: put() minus task_done()
    writers: int = -1  # pipe ends that may still send here; 0 means EOF (-1: not counted)
    tickets: dict[str, bool | None] = field(default_factory=dict)  # pickled ends: ticket ->
    # claimed (None: dropped because the process it was pickled for ended without it)
    subscriber: Peer | None = None  # the process that reads this pipe direction
    cid: int = 0
    signal: Signal | None = None  # set while a reader here would not block
    leases: dict[Peer, Lease] = field(default_factory=dict)  # queue consumers elsewhere, by peer
    getters: deque[Wait] = field(default_factory=deque)  # gets waiting here (threads here,
    # or calls of processes without a stream), in the order they came
    putters: deque[Wait] = field(default_factory=deque)  # puts waiting for room, in order
    watches: list[Wait] = field(default_factory=list)  # polls, joins and counts waiting
    marked: Counter[str] = field(default_factory=Counter)  # `Done`s applied, by process
    source: Peer | None = None  # the process that last sent an item here
    leader: Wake | None = None  # of a thread here reading ``source`` for this pipe
    routed: Peer | None = None  # queue: the consumer producers elsewhere may send to directly
    got_here: bool = False  # queue: a get was served here (it has a consumer besides leases)
    marks: list[Mark] = field(default_factory=list)  # queue flushes waiting to be answered
    feeding: bool = False  # items wait for the `Feeder` to send them (see `deferrable`)

    def deferrable(self) -> bool:
        """Whether an item just put may wait for the `Feeder` (under ``cond``): its only
        consumer is fed ahead and still holds items it has not taken (it takes those first),
        or items wait for the feeder already, fewer than `FEED_BATCH`. So a producer that
        outpaces its consumer sends batches, as the stdlib's feeder thread does, and a
        consumer that took everything gets the next item from the put itself."""
        if self.feeding:
            return len(self.items) < FEED_BATCH
        if len(self.leases) != 1 or self.getters:
            return False
        (lease,) = self.leases.values()
        if not lease.fed:
            return False
        lease.sync()
        return bool(lease.outstanding)

    def feed(self) -> None:
        """The `Feeder`'s turn: send what waits."""
        with self.cond:
            self.feeding = False
            self.dispatch()

    def sole(self) -> Peer | None:
        """The peer of this queue's only consumer, if it has exactly one, elsewhere."""
        if self.writers >= 0 or self.maxsize or self.got_here or len(self.leases) != 1:
            return None
        (peer,) = self.leases
        return peer

    def share(self) -> None:
        """A second consumer came (under ``cond``): producers stop sending to the routed
        one directly, and it hands back what they sent it (see `_route`)."""
        peer, self.routed = self.routed, None
        self.marks.clear()  # its flows stop: what they held goes back to their writers
        if peer is None:
            return
        lease = self.leases.get(peer)
        if lease is not None:
            lease.direct = 0  # on their way back through the producers
        with contextlib.suppress(OSError):
            peer.send(Unroute(self.cid))

    def ask_held(self) -> Callable[[], bool]:
        """Before ``qsize()``: ask every consumer elsewhere that holds items of this queue
        (sent ahead, or sent directly to the routed one) what it holds (under ``cond``); what
        says whether all have answered.

        An answer comes on the consumer's stream after every report it sent before, so an
        item it took before telling anyone (setting an `Event`, say) is counted as taken
        by then, as in the stdlib's pipe: its ``qsize()`` after that ``Event`` sees it."""
        asked: list[tuple[Peer, Lease, int]] = []
        self.sync()
        for peer, lease in self.leases.items():
            if lease.gone or not (lease.outstanding or peer is self.routed):
                continue
            lease.asked += 1
            try:
                peer.send(Count(self.cid, lease.asked))
            except OSError:
                continue
            asked.append((peer, lease, lease.asked))
        return lambda: all(
            lease.answered >= n or lease.gone or peer.ended or self.leases.get(peer) is not lease
            for peer, lease, n in asked)

    def refeed(self) -> None:
        """Tell the consumers elsewhere whether they are fed ahead (under ``cond``).

        A queue's only consumer, whose tally page is read here, is sent every item ahead
        (`dispatch`, up to its window, which the page keeps open): it need not say that it
        waits, a message per get saved. Once another consumer comes (or a get here, or a
        revoke), that stops, and it is told so before anything is sent to another. It stops
        too while items wait here that its window (or `LEASE_BYTES`) kept from it: it takes
        what it has without a word, so it must say when it waits for more."""
        sole = None if self.items else self.sole()
        for peer, lease in self.leases.items():
            fed = peer is sole and lease.slot is not None and not (lease.idle or lease.gone)
            if fed != lease.fed:
                lease.fed = fed
                try:
                    peer.send(Feed(self.cid, fed))
                except OSError:
                    lease.gone = peer.gone = True

    def sync(self) -> None:
        """What every consumer elsewhere took, from its tally page (see `Lease.sync`)."""
        for lease in self.leases.values():
            lease.sync()

    def changed(self) -> None:
        """Items arrived, were taken, or the last writer left (under ``cond``)."""
        self.cond.notify_all()
        if self.leader is not None:
            self.leader.wake()
        if self.signal is not None:
            self.signal.set(bool(self.items) or self.writers == 0)

    def await_item(self, timeout: float | None) -> bool:
        """Wait (under ``cond``) until an item or end-of-file is here, up to ``timeout``.

        If the last sender is another process and no thread reads its stream, this thread
        reads it itself (see `_hub`), instead of being woken by the thread that would."""
        deadline = _timing.Deadline(timeout)
        while not (self.items or self.writers == 0):
            left = deadline.left()
            if left == 0:
                return False
            peer = self.source
            if self.leader is None and peer is not None:
                self.leader = thread_wake()
                try:
                    if peer.try_lead(self.cond, self.leader, left, keep=self.signal is None):
                        continue
                finally:
                    self.leader = None
            self.cond.wait(left)
        return True

    def size(self) -> int:
        """Items put and not yet taken (those sent ahead to consumers, or sent to them
        directly by producers, included)."""
        self.sync()
        return len(self.items) + sum(len(lease.outstanding) + lease.direct
                                     for lease in self.leases.values())

    def ahead_of(self, taker: Peer | None) -> bool:
        """Whether a consumer other than ``taker`` (a consumer's peer, or None for a thread
        here) holds items sent ahead that it has not taken: they come before every item
        here, so ``taker`` may take none of these until they are back (`revoke`)."""
        if not self.leases:
            return False
        self.sync()
        return any(lease.holds_ahead() for peer, lease in self.leases.items()
                   if peer is not taker)

    def dispatch(self) -> None:
        """`_dispatch`; then a fed consumer whose window keeps items here is fed no more."""
        self._dispatch()
        if self.items and any(lease.fed for lease in self.leases.values()):
            self.refeed()

    def _dispatch(self) -> None:
        """Send items to consumer processes (under ``cond``), never ahead of a waiter, and
        in queue order: no one is handed an item while an earlier one, sent ahead to
        another consumer, is neither taken nor handed back (`ahead_of`).

        As many items as gets wait here stay for them (`Channels.settle` hands them out);
        of the rest, each consumer thread waiting elsewhere gets one; only when nobody
        waits are items sent ahead, to one consumer at a time (another one taking later
        items than those would break the order).
        """
        if not self.leases:
            return
        self.sync()
        # the consumers holding items sent ahead (sending to waiters adds none)
        holders = [peer for peer, lease in self.leases.items() if lease.holds_ahead()]
        spare = len(self.items) - len(self.getters)
        for peer, lease in list(self.leases.items()):
            if spare <= 0:
                break
            if lease.wanted > 0 and not (lease.revoking or lease.gone or _other(holders, peer)):
                n = min(lease.wanted, spare)
                lease.wanted -= n
                spare -= n
                self._send(lease, n)
        if spare <= 0 or self.getters or any(
                lease.wanted > 0 for lease in self.leases.values()):
            return
        for peer, lease in list(self.leases.items()):
            if spare <= 0:
                break
            if lease.idle or _other(holders, peer):
                continue
            n, size = 0, lease.nbytes
            while (n < spare and len(lease.outstanding) + n < lease.window
                   and size < LEASE_BYTES and not (lease.revoking or lease.gone)):
                size += len(self.items[n])
                n += 1
            if n:
                spare -= n
                self._send(lease, n)
                lease.ahead_until = lease.consumed + len(lease.outstanding)
                holders.append(peer)

    def _send(self, lease: Lease, n: int) -> None:
        batch = tuple([self.items.popleft() for _ in range(n)])
        try:
            lease.peer.send(Items(self.cid, batch))
        except OSError:  # the consumer's process is ending: this batch stays here, and what
            # it was sent before goes back once its last reports are read (`Channels.lost`)
            self.items.extendleft(reversed(batch))
            lease.gone = lease.peer.gone = True
            return
        lease.outstanding.extend(batch)
        lease.nbytes += sum(len(item) for item in batch)
        lease.sent += n
        for mark in list(self.marks) if self.marks else ():
            if mark.peer is lease.peer:
                mark.left -= n
                if mark.left <= 0:  # what was here at the flush is sent: its producer's
                    # direct items may follow
                    self.marks.remove(mark)
                    with contextlib.suppress(OSError):
                        lease.peer.send(Flushed(self.cid, True, mark.nonce))

    def revoke(self, waiter: Peer | None = None) -> None:
        """Someone (``waiter``: a consumer's peer, or None for a thread here) waits: ask
        every other consumer that holds items sent ahead for those it has not taken (they
        come first), and, if nothing is here for the waiter, any other for all of them."""
        if not self.leases:
            return
        short = len(self.items) <= len(self.getters)
        self.sync()
        for peer, lease in self.leases.items():
            if peer is waiter or lease.revoking or lease.gone or not lease.outstanding or (
                    not short and not lease.holds_ahead()):
                continue
            try:
                peer.send(Revoke(self.cid))
                lease.revoking = lease.idle = True
                lease.fed = False  # it stops counting on being fed when it reads the revoke
            except OSError:
                pass  # its stream is closing: `drop_lease` follows

    def drop_lease(self, peer: Peer, consumed: int | None = None, kept: int = 0) -> None:
        """Items sent to ``peer`` and not taken come back to the front of the queue, but
        the first ``kept`` (its waiting threads take them).

        ``consumed`` and ``kept`` answer a revoke: it had taken ``consumed`` in all then, and
        nothing was sent to it since, so all but the first ``kept`` after those come back
        (its tally page may count some of the kept ones as taken already). Without them its
        process ended, and its tally page says exactly what it took."""
        lease = self.leases.get(peer)
        if lease is None:
            return
        if consumed is None:
            lease.sync()
            returned = len(lease.outstanding)
        else:
            lease.taken(consumed)
            lease.sync()  # beyond ``consumed``: kept ones it took since
            returned = len(lease.outstanding) - max(0, kept - (lease.consumed - consumed))
        back = [lease.outstanding.pop() for _ in range(returned)]
        self.items.extendleft(back)
        lease.nbytes = sum(len(item) for item in lease.outstanding)
        lease.ahead_until = lease.consumed  # it holds nothing ahead now
        lease.revoking = False
        if consumed is None:
            del self.leases[peer]
        self.cond.notify_all()

    def push(self) -> None:
        """Hand queued items (and end-of-file) to the subscribed reader (under ``cond``)."""
        peer = self.subscriber
        if peer is None:
            return
        try:
            while self.items:
                peer.send(Item(self.cid, self.items[0]))
                self.items.popleft()
            if self.writers == 0:
                peer.send(Eof(self.cid))
        except OSError:  # the reader's process is gone: keep the rest here
            self.subscriber = None


def _other(holders: list[Peer], peer: Peer | None) -> bool:
    """Whether a consumer other than ``peer`` is among ``holders``."""
    return any(holder is not peer for holder in holders)


class Feeder:
    """A thread that sends queue items their put left to it (see `Chan.deferrable`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.chans: list[Chan] = []
        self.busy = False  # the thread is sending
        self.thread: threading.Thread | None = None

    def schedule(self, chan: Chan) -> None:
        with self.cond:
            self.chans.append(chan)
            self.cond.notify_all()  # the thread (and `drain`, which waits on it too)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="fiberexec-mp-feeder")
                self.thread.start()

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.chans)  # idle until a put leaves it items
                chans, self.chans = self.chans, []
                self.busy = True
            try:
                for chan in chans:
                    chan.feed()
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()

    def flush(self) -> None:
        """Send what waits now, from this thread."""
        with self.cond:
            chans, self.chans = self.chans, []
        for chan in chans:
            chan.feed()

    def drain(self, timeout: float) -> bool:
        """Before this process exits: wait up to ``timeout`` until the thread has sent what
        puts left to it (a consumer that stopped reading could hold a send up for ever, as
        it holds up the stdlib's feeder thread at exit); False if it has not."""
        with self.cond:
            return self.thread is None or self.cond.wait_for(
                lambda: not (self.chans or self.busy), timeout)

class Channels:
    """This process's queues and pipe channels (see the module's docstring)."""

    def __init__(self, clock: _timing.Clock = time.monotonic,
                 feeder: Feeder | None = None) -> None:
        self.clock = clock
        self.feeder = Feeder() if feeder is None else feeder
        self.chans: dict[int, Chan] = {}
        self.held: dict[str, Counter[int]] = {}  # process token -> pipe-end counts it holds
        self.inlets: dict[str, Peer] = {}  # pipe readers' `_route.Inlet` addresses -> peer
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def step(self, peer: Peer, frame: Frame) -> None:  # noqa: PLR0912 (a case a kind)
        """Apply one frame of ``peer``'s stream (`_hub`)."""
        match frame:
            case Put(cid, data):
                self.append(cid, data, peer)
            case Want():
                self._lease(peer, frame)
            case Returned():
                self._lease_returned(peer, frame)
            case Subscribe(cid):
                self._subscribe(cid, peer)
            case Unsubscribe(cid):
                self._unsubscribe(cid, peer)
            case Claim(cid, ticket):
                self.claim(cid, ticket, peer.holder or "")
            case Release(cid):
                self.unref(cid, peer.holder or "")
            case Holder(token):
                peer.holder = token
            case Flush(cid, nonce, inlet):
                self._flush(cid, nonce, inlet)
            case InletAt(address):
                with self.lock:
                    peer.inlet = address
                    self.inlets[address] = peer
            case Tally():
                self._tally(peer, frame)
            case Counted():
                self._counted(peer, frame)
            case Done(cid):
                self._done(cid, peer.holder or "")
            case _:
                raise unexpected("a broker's stream", frame)

    def chan(self, cid: int) -> Chan:
        chan = self.chans.get(cid)
        if chan is None:
            raise ValueError(f"queue {cid} does not exist on this broker (was it closed?)")
        return chan

    @contextlib.contextmanager
    def turn(self, cid: int) -> Iterator[Chan]:
        """Channel ``cid``, under its condition; settled at the end (`settle`)."""
        chan = self.chan(cid)
        with chan.cond:
            try:
                yield chan
            finally:
                self.settle(chan)

    def settle(self, chan: Chan) -> None:
        """Answer the calls waiting on ``chan`` that can be answered now (under ``cond``),
        then those whose deadline passed on the clock."""
        if not (chan.getters or chan.putters or chan.watches):
            return
        answered = self._answer(chan)
        if chan.getters or chan.putters or chan.watches:
            answered = self._expire(chan) or answered
        if answered:
            chan.changed()

    def _answer(self, chan: Chan) -> bool:
        """Watches that came true; puts for room and gets, each in the order they came (a
        get is never handed an item while an earlier one, sent ahead to a consumer
        elsewhere, is neither taken nor handed back); gets at end-of-file. Whether any."""
        answered = False
        for watch in [w for w in chan.watches if w.until is not None and w.until()]:
            chan.watches.remove(watch)
            watch.status, answered = OK, True
        while True:  # (an item a get takes makes room for a put, whose item a get takes)
            if chan.putters and (chan.size() < chan.maxsize or not chan.maxsize):
                put = chan.putters.popleft()
                put.status = OK
                self._append(chan, put.body)
            elif chan.getters and chan.items and not chan.ahead_of(None):
                get = chan.getters.popleft()
                get.body, get.status = chan.items.popleft(), OK
            else:
                break
            answered = True
        if chan.getters and chan.writers == 0 and not chan.items:
            for get in chan.getters:
                get.status = EOF
            chan.getters.clear()
            answered = True
        return answered

    def _expire(self, chan: Chan) -> bool:
        """Answer the calls whose deadline passed: a get `EMPTY` (what it left may go to
        consumers elsewhere), a put `FULL`, a watch `EMPTY`. Whether any."""
        now, expired = self.clock(), False
        for waits, status in ((chan.getters, EMPTY), (chan.putters, FULL),
                              (chan.watches, "")):
            for wait in [w for w in waits if now >= w.deadline] if waits else ():
                waits.remove(wait)
                wait.status = status or EMPTY
                expired = True
                if status == EMPTY:
                    chan.dispatch()
        return expired

    def _block(self, chan: Chan, wait: Wait) -> None:
        """Block (under ``cond``) until ``wait`` is answered: by a step, or by `settle` once
        its deadline passes on the clock; the call of a client that hung up meanwhile is
        answered now, as if its deadline had passed."""
        while not wait.status:
            left = max(0.0, wait.deadline - self.clock())
            if left:
                caller_waits(lambda piece: chan.cond.wait_for(
                    lambda: bool(wait.status), piece), left)
                if not wait.status and caller_gone():
                    wait.deadline = self.clock()
            self.settle(chan)

    def _deadline(self, wait: float) -> float:
        return self.clock() + max(0.0, wait)

    def new(self, maxsize: int, writers: int) -> int:
        with self.lock:
            cid = next(self.ids)
            self.chans[cid] = Chan(maxsize=max(0, maxsize), writers=writers, cid=cid)
        return cid

    def put(self, body: bytes, cid: int, wait: float) -> str:
        """Put an item, waiting up to ``wait`` seconds for room in a bounded queue."""
        with self.turn(cid) as chan:
            put = self._enter_put(chan, body, wait)
            self._block(chan, put)
            return put.status

    def begin_put(self, body: bytes, cid: int, wait: float) -> Wait:
        """`put`, answered now if it can be, else left waiting (for a step, or the clock)."""
        with self.turn(cid) as chan:
            return self._enter_put(chan, body, wait)

    def _enter_put(self, chan: Chan, body: bytes, wait: float) -> Wait:
        put = Wait(self._deadline(wait), body)
        chan.putters.append(put)
        self.settle(chan)
        return put

    def append(self, cid: int, body: bytes, source: Peer | None = None) -> None:
        """Add an item to a pipe direction or an unbounded queue (no RPC layer in between);
        ``source`` is the `_hub.Peer` it came from, if it came from another process."""
        chan = self.chans.get(cid) or self.chan(cid)
        with chan.cond:  # (`turn`, without its cost: a pipe's every message comes here)
            if source is not None:
                chan.source = source
            self._append(chan, body)
            if chan.getters or chan.watches:
                self.settle(chan)

    def _append(self, chan: Chan, body: bytes) -> None:
        chan.items.append(body)
        chan.unfinished += 1
        chan.changed()
        if chan.subscriber is not None:
            chan.push()
        if chan.leases:
            if not chan.deferrable():
                chan.dispatch()
            elif not chan.feeding:
                chan.feeding = True
                self.feeder.schedule(chan)

    def get(self, cid: int, wait: float) -> tuple[str, bytes]:
        """Take an item, waiting up to ``wait`` seconds; `EOF` once no writer is left."""
        chan = self.chans.get(cid) or self.chan(cid)
        with chan.cond:  # (`turn`, without its cost: the creator's every get comes here)
            get = self._enter_get(chan, wait)
            self._block(chan, get)
        return get.status, get.body

    def begin_get(self, cid: int, wait: float) -> Wait:
        """`get`, answered now if it can be, else left waiting (for a step, or the clock)."""
        with self.turn(cid) as chan:
            return self._enter_get(chan, wait)

    def _enter_get(self, chan: Chan, wait: float) -> Wait:
        if not chan.got_here:
            chan.got_here = True
            chan.share()
            chan.refeed()
        get = Wait(self._deadline(wait))
        chan.revoke()  # before counting this get: "nothing here" is for it
        chan.getters.append(get)
        self.settle(chan)
        return get

    def expect(self, cid: int) -> None:
        """A thread here is about to send on a duplex pipe end that reads ``cid``: if the
        answer will come from another process, hold that process's stream for this thread
        to read (see `_links.Reader.hold`); not when ``fileno()`` was asked for (a `select` on
        it must see the answer as soon as it arrives)."""
        chan = self.chans.get(cid)
        if chan is not None and chan.signal is None and chan.leader is None and (
                chan.source is not None and not chan.items):
            chan.source.hold()

    def take_item(self, cid: int) -> bytes:
        """A pipe end here receives (blocking); EOFError once no writer is left."""
        chan = self.chans.get(cid) or self.chan(cid)
        with chan.cond:
            chan.await_item(None)
            if not chan.items:
                raise EOFError
            item = chan.items.popleft()
            if chan.signal is not None:
                chan.signal.set(bool(chan.items))
            return item

    def drop_signal(self, cid: int) -> None:
        chan = self.chans.get(cid)
        if chan is not None and chan.signal is not None:
            with chan.cond:
                sig, chan.signal = chan.signal, None
            if sig is not None:
                sig.close()

    def signal(self, cid: int) -> int:
        """A descriptor readable while pipe ``cid`` has data or EOF here (`_links.Signal`)."""

        chan = self.chan(cid)
        with chan.cond:
            if chan.signal is None:
                chan.signal = Signal()
                if chan.source is not None:  # a select on it must see the answer at once
                    chan.source.unhold()
            chan.signal.set(bool(chan.items) or chan.writers == 0)
            return int(chan.signal.r)

    def ready(self, cid: int, timeout: float | None) -> bool:
        """Whether a pipe end here has data or end-of-file, waiting up to ``timeout``."""
        chan = self.chan(cid)
        with chan.cond:
            return chan.await_item(timeout)

    def poll(self, cid: int, wait: float) -> bool:
        """Whether an item (or end-of-file) is here, waiting up to ``wait`` seconds."""
        with self.turn(cid) as chan:
            return self._watch(chan, self._deadline(wait),
                               lambda: bool(chan.items) or chan.writers == 0)

    def qsize(self, cid: int) -> tuple[int, int]:
        """Items put and not taken (asking consumers elsewhere first, for `Timing.count`
        at most), and the queue's size."""
        with self.turn(cid) as chan:
            deadline = self._deadline(_timing.TIMING.count)  # (from the moment it asks)
            self._watch(chan, deadline, chan.ask_held())
            return chan.size(), chan.maxsize

    def task_done(self, cid: int, holder: str = "", marked: int = 0) -> None:
        """Mark an item of a `JoinableQueue` done; ValueError if none is left to mark. The
        ``marked`` marks ``holder``'s process sent on its stream before are counted first
        (they travel on another connection: up to `Timing.call` for them to arrive)."""
        with self.turn(cid) as chan:
            if marked:
                self._watch(chan, self._deadline(_timing.TIMING.call),
                            lambda: chan.marked[holder] >= marked)
            if chan.unfinished <= 0:
                raise ValueError("task_done() called too many times")
            chan.unfinished -= 1

    def _done(self, cid: int, holder: str) -> None:
        """A process's ``task_done()`` for an item it took, sent on its stream (no answer):
        its count said it took more than it marked done, so only more calls than items put,
        made by other processes meanwhile, find none to mark."""
        with self.turn(cid) as chan:
            chan.marked[holder] += 1
            if chan.unfinished > 0:
                chan.unfinished -= 1
            else:
                log.warning("JoinableQueue %d: task_done() was called more times than items "
                            "were put (the last call came from another process's stream, "
                            "which cannot be told)", cid)

    def join(self, cid: int, wait: float) -> bool:
        """Whether every item put was marked done, waiting up to ``wait`` seconds."""
        with self.turn(cid) as chan:
            return self._watch(chan, self._deadline(wait), lambda: chan.unfinished == 0)

    def _watch(self, chan: Chan, deadline: float, until: Callable[[], bool]) -> bool:
        """Wait (under ``cond``) until ``until()``, or ``deadline`` on the clock: whether it
        came."""
        if until():
            return True
        watch = Wait(deadline, until=until)
        chan.watches.append(watch)
        self.settle(chan)
        self._block(chan, watch)
        return watch.status == OK

    def ref(self, cid: int, ticket: str) -> bool:
        """A pipe end is being pickled: hold a count for the copy until it is unpickled.

        Pickling the same end twice with the same unclaimed ticket (cloudpickle's second
        pass) holds one count; False asks for a fresh ticket (the old one was claimed).
        """
        chan = self.chan(cid)
        with chan.cond:
            if ticket in chan.tickets:
                return not chan.tickets[ticket]
            chan.tickets[ticket] = False
            if chan.writers > 0:
                chan.writers += 1
        return True

    def claim(self, cid: int, ticket: str, holder: str) -> None:
        """A copy was unpickled by ``holder`` (a process token): it owns the ticket's count
        (a second copy, or a copy of a dropped ticket, takes another)."""
        chan = self.chan(cid)
        with chan.cond:
            if chan.writers < 0:
                return
            dropped = ticket in chan.tickets and chan.tickets[ticket] is None
            if chan.tickets.get(ticket) is False:
                chan.tickets[ticket] = True
            elif chan.writers > 0 or dropped:
                chan.writers += 1
                chan.tickets[ticket] = True
            self.held.setdefault(holder, Counter())[cid] += 1

    def unref(self, cid: int, holder: str, count: int = 1) -> None:
        """``holder`` closed ``count`` copies of an end; at zero the reader sees EOF."""
        with self.turn(cid) as chan:
            held = self.held.get(holder)
            if held is not None and held[cid] > 0:
                held[cid] -= 1
            if chan.writers > 0:
                chan.writers = max(0, chan.writers - count)
                chan.changed()
                chan.push()

    def drop_tickets(self, tickets: list[tuple[int, str]]) -> None:
        """A process ended: the counts of ends pickled for it that it never claimed go."""
        for cid, ticket in tickets:
            chan = self.chans.get(cid)
            if chan is None:
                continue
            with chan.cond:
                if chan.tickets.get(ticket) is not False:
                    continue
                chan.tickets[ticket] = None
            self.unref(cid, "")

    def _subscribe(self, cid: int, peer: Peer) -> None:
        """``peer``'s process reads ``cid``: items go to it as they arrive."""
        with self.turn(cid) as chan:
            old, chan.subscriber = chan.subscriber, peer
            if old is not None and old is not peer and old.inlet:
                with contextlib.suppress(OSError):  # writers sending to it directly stop
                    old.send(Unroute(cid))
            chan.push()

    def route(self, cid: int, caller: str) -> str | None:
        """Where a writer of pipe ``cid``, or a producer of unbounded queue ``cid``, may
        send directly (see `_route`): the address of the inlet of the process that reads
        the pipe, or of the queue's only consumer; or "" (none elsewhere, or the caller);
        None for a queue that will never be routed (bounded, or consumed here)."""
        chan = self.chan(cid)
        with chan.cond:
            if chan.writers < 0 and (chan.maxsize or chan.got_here):
                return None
            peer = chan.subscriber if chan.writers >= 0 else chan.sole()
            if peer is None or not peer.inlet or peer.gone or peer.ended or (
                    peer.holder == caller):
                return ""
            if chan.writers < 0:
                chan.routed = peer
            return peer.inlet

    def _flush(self, cid: int, nonce: bytes, inlet: str) -> None:
        """A writer will send ``cid`` directly to ``inlet``'s process from now on: tell that
        process once all the writer relayed before is on its way to it (``ok``), or that it
        is not (the pipe is read elsewhere now), in the order of what was pushed to it."""
        peer = self.inlets.get(inlet)
        if peer is None or cid not in self.chans:
            return
        with self.turn(cid) as chan:
            if chan.writers < 0 and chan.routed is peer and chan.items:
                # a queue: its consumer is told once what is here now was sent to it
                # (as its window allows), as long as it stays the only consumer
                chan.marks.append(Mark(peer, nonce, len(chan.items)))
                chan.dispatch()
                return
            ok = (chan.subscriber if chan.writers >= 0 else chan.routed) is peer and (
                not chan.items)
            with contextlib.suppress(OSError):
                peer.send(Flushed(cid, ok, nonce))

    def _unsubscribe(self, cid: int, peer: Peer) -> None:
        chan = self.chans.get(cid)
        if chan is not None:
            with chan.cond:
                if chan.subscriber is peer:
                    chan.subscriber = None

    def _lease(self, peer: Peer, want: Want) -> None:
        """A consumer's state: it took ``consumed`` items of the ``received`` sent to it in
        all, ``wanted`` threads of it wait with nothing at hand, it accepts ``window``; and
        when it asks (``settle``), the answer that what was sent for its waiting threads
        is on its way (`Settled`: after those items on its stream)."""
        cid, consumed, received, wanted, window = (
            want.cid, want.consumed, want.received, want.wanted, want.window)
        with self.turn(cid) as chan:
            lease = chan.leases.get(peer)
            if lease is None:
                if peer.gone:
                    return
                lease = chan.leases[peer] = Lease(peer, slot=peer.slots.get(cid))
                if chan.routed is not None and chan.routed is not peer:
                    chan.share()
            lease.taken(consumed)  # (what it took may be all that came before a get here,
            # or make room for a put: the turn's end settles them)
            lease.window = window
            lease.wanted = max(0, wanted - (lease.sent - received))  # minus those on the way
            if wanted:
                lease.idle = False
            if lease.wanted:
                chan.revoke(peer)
            if chan.items:
                chan.dispatch()
            chan.refeed()
            if want.settle:
                with contextlib.suppress(OSError):  # its stream is closing
                    peer.send(Settled(cid, want.settle))

    def _tally(self, peer: Peer, tally: Tally) -> None:
        """A consumer elsewhere counts what it takes of queue ``cid`` in a page of shared
        memory (`_tally`): map it if it is on this host, and say so; else it goes on
        reporting every item it takes."""
        cid, slot, nonce, path = tally.cid, tally.slot, tally.nonce, tally.path
        chan = self.chan(cid)
        if chan.maxsize:  # a put waiting for room learns of each take (`lease`)
            return
        if peer.tally is None or peer.tally.nonce != nonce:
            try:
                view = _tally.TallyView(path, nonce)
            except OSError as exc:  # another host or PID namespace
                log.debug("a consumer's tally page cannot be read here: %s", exc)
                return
            if peer.tally is not None:
                peer.tally.close()
            peer.tally = view
        with chan.cond:
            peer.slots[cid] = slot
            lease = chan.leases.get(peer)
            if lease is not None:
                lease.slot = slot
        with contextlib.suppress(OSError):
            peer.send(Tallied(cid))

    def _lease_returned(self, peer: Peer, returned: Returned) -> None:
        """A consumer answered a revoke: it took ``consumed`` in all and keeps the next
        ``kept`` for threads of it that wait, the rest come back; ``wanted`` of its threads
        wait with nothing at hand."""
        with self.turn(returned.cid) as chan:
            chan.drop_lease(peer, returned.consumed, returned.kept)
            lease = chan.leases.get(peer)
            if lease is not None:
                lease.wanted = returned.wanted
                if returned.wanted:
                    lease.idle = False
            self.settle(chan)  # the gets here first: what came back is theirs
            chan.dispatch()
            chan.refeed()

    def _counted(self, peer: Peer, counted: Counted) -> None:
        """A consumer's answer to `Chan.ask_held`."""
        with self.turn(counted.cid) as chan:
            lease = chan.leases.get(peer)
            if lease is not None and counted.asked > lease.answered:
                lease.answered = counted.asked
                lease.direct = counted.direct if chan.routed is peer else 0

    def lost(self, peer: Peer) -> None:
        """A process's stream closed (it exited or died): release all it held."""
        for chan in list(self.chans.values()):
            if chan.subscriber is peer:
                self._unsubscribe(chan.cid, peer)
            if peer in chan.leases:
                with self.turn(chan.cid):
                    if chan.routed is peer:
                        chan.routed = None
                        chan.marks = [mark for mark in chan.marks if mark.peer is not peer]
                    chan.drop_lease(peer)
                    self.settle(chan)  # the gets here first: what came back is theirs
                    chan.dispatch()
                    chan.refeed()
        if peer.inlet:
            with self.lock:
                if self.inlets.get(peer.inlet) is peer:
                    del self.inlets[peer.inlet]
        held = self.held.pop(peer.holder, None) if peer.holder is not None else None
        for cid, count in (held or Counter()).items():
            if count > 0 and cid in self.chans:
                self.unref(cid, "", count)
