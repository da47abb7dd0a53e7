"""Pipe and queue traffic without round trips: one authenticated stream per process pair.

    process C (holds pipe ends or queues of broker B)        B (the creating process)
      Stream -- `_links.dial` (Unix or TCP), then `Wire` --> Hub: a thread per stream
        send(x) / put(x) -> Put(cid, data)   (no reply)  ->  put into the channel
        first recv    -> Subscribe(cid)                  ->  queued items, then each new
        recv()        <- Item(cid, data) / Eof(cid)      <-  item as it arrives
        unpickle end  -> Claim(cid, ticket); close -> Release(cid)
        queue get     -> Want(cid, counts)  -> items for waiters, then ahead
                      <- Items(cid, items) / Revoke(cid) (give back what you have not taken)
                      -> Returned(cid, counts) (answer to Revoke)
        first get     -> Tally(cid, page) (`_tally`)  -> <- Tallied(cid): I read your count
                      <- Feed(cid, on): you are (no longer) fed ahead, need not say you wait

The stream is opened once, through the broker's RPC (``"stream"``), and authenticated with
the broker's secret by `_links`' handshake before any frame is read;
frames are typed (`_frames`) and carry items as raw bytes (nothing here is unpickled). A
pipe between the creating process and another process thus flows over one direct
connection between them, with no round trip per message; a pipe between two other
processes, and a queue between a producer and its only consumer, go directly between them
once the creator has introduced them (see `_route`), else through the creator. When a
stream closes (its process exited or died), the broker releases every pipe end that
process held, so the reader at the other end sees EOF instead of waiting forever, and
queue items sent ahead to it that it had not taken go back to the queue.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _tally, _timing
from fiberexec.multiprocessing._cond import Condition
from fiberexec.multiprocessing._frames import (
    Count,
    Counted,
    Done,
    Eof,
    Feed,
    Flushed,
    Frame,
    Holder,
    InletAt,
    Item,
    Items,
    Returned,
    Revoke,
    Settled,
    Subscribe,
    Tallied,
    Tally,
    Unroute,
    Unsubscribe,
    Want,
    decode,
    unexpected,
)
from fiberexec.multiprocessing._links import STREAM, Reader, Signal, Wire, dial, half_close
from fiberexec.multiprocessing._rpc import Endpoint, _local_servers, client_for, process_token
from fiberexec.multiprocessing._tally import TallyPage

if TYPE_CHECKING:  # _route builds on this module
    from fiberexec.multiprocessing._route import Inlet, Outlets

log = logging.getLogger("fiberexec.multiprocessing")
WINDOW = 256  # queue items a consumer accepts ahead of its gets
REPORT = WINDOW // 4  # a consumer whose broker reads its tally page reports every REPORT takes


# ---------------------------------------------------------------------------- client side


class _Lane:
    """One queue as consumed in this process: the items at hand, and counts.

    ``items`` holds, in the order they arrived, the broker's items (bytes) and items its
    producers sent here directly (`_route.Direct`, which carry their writer's flow)."""

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.received = 0  # items the broker sent here in all
        self.consumed = 0  # of those, taken here in all
        self.waiting = 0  # threads here waiting in get()
        self.settling = 0  # of those, gave up and wait for the broker's word (`Stream.get`)
        self.settle = 0  # the last `Settled` asked for, and the last answered
        self.settled = 0
        self.direct = 0  # items at hand that producers sent here directly
        self.told = 0  # ``consumed`` when the broker was last told
        self.done = 0  # ``task_done()`` calls sent for this queue (a `JoinableQueue`)
        self.slot: int | None = None  # its count in the stream's tally page (`_tally`)
        self.tallied = False  # the broker reads that count: no report per item is needed
        self.fed = False  # its only consumer: the broker sends it every item ahead (`Feed`)


class Stream:
    """This process's stream to one broker: sends frames, receives pipe and queue items.

    Read as `_links.Reader` says, with no thread of its own while only pipes are read: the
    first waiter reads for all. A queue consumed, a pipe's ``fileno()`` asked for or a
    direct writer starts one for good, as the broker may then send at any time.

    Queue consumption: a get that finds nothing here tells the broker how many threads wait
    (`Want`), and the broker sends items as they come; once nobody waits anywhere, it also
    sends up to `WINDOW` items ahead, so a consumer that keeps up takes them with no round
    trip. Every get counts what was taken before it returns, which keeps ``qsize()`` in the
    creator true and tells the broker what to hand back if this process ends: in the tally
    page where the broker reads it (`_tally`; then a report `Want` goes every `REPORT`
    gets, and the only consumer, told it is fed (`Feed`), need not say when it waits),
    else in a report per get. When another consumer waits while items sit unread here, the
    broker revokes them (`Revoke`): the reader drops them, but those its waiting threads
    take, and answers with what was taken and kept (`Returned`); the rest go to the others,
    before any later item (see `_channels.Chan.dispatch`).
    """

    def __init__(self, address: tuple[str, int, str], endpoint: Endpoint) -> None:
        self.where = endpoint.address
        self.endpoint = endpoint
        self.secret = endpoint.secret
        self.inlet: Inlet | None = None  # writers elsewhere send here directly
        self.outlets: Outlets | None = None  # pipes this process writes
        host, port, unix = address
        self.conn = Wire(dial(endpoint.secret, unix, (host, port), service=STREAM,
                              timeout=_timing.TIMING.stream))
        # the broker's RPC connection watches its liveness for us (see `_rpc`): when it is
        # lost, so is this stream, and whoever waits on it wakes
        self.rpc = client_for(endpoint.address, endpoint.secret)
        self.why = f"the process that created this pipe or queue ({self.where}) is gone"
        self.send_lock = threading.Lock()
        self.cond = Condition()
        self.inbox: defaultdict[int, deque[bytes]] = defaultdict(deque)
        self.eof: set[int] = set()
        self.subscribed: defaultdict[int, int] = defaultdict(int)
        self.lanes: dict[int, _Lane] = {}
        self.signals: dict[int, Signal] = {}  # pipe ends whose fileno() was asked for
        self.tally: TallyPage | None = None  # counts of queue items taken, for the broker
        self.lost = False
        # read by a thread waiting for what it brings, or once needed by a thread of its own
        self.reader = Reader(self.conn, self._on_frame, self._ended)
        self.send(Holder(process_token()))
        self.rpc.on_lost(self._abort)

    def _abort(self) -> None:
        """The broker's process is gone: end the stream, waking a thread blocked reading it."""
        self.why = f"{self.why}: {self.rpc.why}"
        self.conn.shutdown()
        self._ended()

    def _ended(self) -> None:
        with self.cond:
            self.lost = True
            self._signal_all()
            self.cond.notify_all()
            if self.inlet is not None:
                self.inlet.wake()

    def _signal_all(self) -> None:
        for sig in self.signals.values():  # recv() raises at once: ready
            sig.set(True)

    def send(self, frame: Frame) -> None:
        if self.lost:
            raise BrokenPipeError(self.why)
        try:
            with self.send_lock:
                self.conn.send(frame)
        except OSError as exc:
            self.lost = True
            raise BrokenPipeError(self.why) from exc

    def put(self, cid: int, data: bytes, queue: bool = False) -> None:
        """Send a pipe item, or an item of an unbounded ``queue``: directly to the pipe's
        reader or the queue's only consumer when that is another process on this host
        (see `_route`), else through the broker."""
        outlets = self.outlets
        if outlets is None:
            from fiberexec.multiprocessing._route import Outlets

            with self.cond:
                if self.outlets is None:
                    self.outlets = Outlets(self)
                outlets = self.outlets
        outlets.put(cid, data, queue)

    def _await(self, ready: Callable[[], object], timeout: float | None,
               cid: int | None = None) -> bool:
        """Wait until ``ready()`` (or the stream is lost), reading the socket as leader when
        no one else does and no thread of its own has started (see `_links.Reader`), or the
        direct connection pipe ``cid``'s items come over (see `_route.Inlet.lead`). Call
        with ``cond`` held."""
        deadline = _timing.Deadline(timeout)
        reader = self.reader
        with self.rpc.busy():
            while not (ready() or self.lost):
                left = deadline.left()
                if left == 0:
                    return False
                if not reader.serving and reader.try_lead(self.cond, None, left, keep=False):
                    self.cond.notify_all()  # another waiter may lead now
                elif cid is None or self.inlet is None or not self.inlet.lead(cid, left):
                    self.cond.wait(left)
        return True

    def _on_frame(self, raw: bytes) -> None:
        frame = decode(raw)
        with self.cond:
            self._file(frame)
            self.cond.notify_all()

    def _file(self, frame: Frame) -> None:  # noqa: PLR0912 (a case a kind)
        """File one frame from the broker (under ``cond``)."""
        inlet = self.inlet
        match frame:
            case Item(cid, data):
                self.deliver(cid, data)
            case Eof(cid):
                self._eof(cid)
            case Items(cid, items):
                self._items(cid, items)
            case Tallied(cid):
                self._lane(cid).tallied = True
            case Feed(cid, on):
                self._lane(cid).fed = on
            case Revoke(cid):
                self._revoked(cid, self._lane(cid))
            case Settled(cid, settle):
                lane = self._lane(cid)
                lane.settled = max(lane.settled, settle)
            case Count(cid, asked):
                self._count(cid, asked)
            case Flushed(cid, ok, nonce):
                if inlet is not None:  # it answers a route to this process's inlet
                    inlet.flushed(cid, ok, nonce)
            case Unroute(cid):
                if inlet is not None:
                    inlet.stop(cid)
            case _:
                raise unexpected("a process's stream", frame)

    def _eof(self, cid: int) -> None:
        if self.inlet is None or self.inlet.eof(cid):
            self.end(cid)
        # else: after the items of writers that send here directly (`_route`)

    def _items(self, cid: int, items: tuple[bytes, ...]) -> None:
        lane = self._lane(cid)
        lane.items.extend(items)
        lane.received += len(items)
        if self.inlet is not None and self.inlet.leaders:
            self.inlet.wake(cid)  # a thread reading a producer's connection for them

    def _count(self, cid: int, asked: int) -> None:
        held = self.inlet.held(cid) if self.inlet is not None else 0
        with contextlib.suppress(ConnectionError):
            self.send(Counted(cid, asked, self._lane(cid).direct + held))

    def _revoked(self, cid: int, lane: _Lane) -> None:
        """The broker's items go back, but those threads here wait for: they are handed
        out already (another consumer may have been handed later ones since, and gets
        what comes back); direct items stay (under ``cond``)."""
        kept, items = 0, deque[Any]()
        lane.fed = False  # it says when it waits again
        for item in lane.items:
            if type(item) is bytes:
                if kept == lane.waiting:
                    continue
                kept += 1
            items.append(item)
        lane.items = items
        with contextlib.suppress(ConnectionError):
            self.send(Returned(cid, lane.consumed, _wanted(lane, kept), kept))

    def deliver(self, cid: int, data: bytes) -> None:
        """File an item for pipe ``cid``, from the broker or directly from its writer
        (under ``cond``)."""
        self.inbox[cid].append(data)
        self._ready(cid)

    def end(self, cid: int) -> None:
        """File end-of-file for pipe ``cid`` (under ``cond``)."""
        self.eof.add(cid)
        self._ready(cid)
        self.cond.notify_all()

    def _ready(self, cid: int) -> None:
        """``cid`` has something to read: wake a thread reading its writer's connection
        (`_route.Inlet.lead`) and set its `Signal`."""
        if self.inlet is not None and self.inlet.leaders:
            self.inlet.wake(cid)
        sig = self.signals.get(cid)
        if sig is not None:
            sig.set(True)

    def _open_inlet(self) -> None:
        """Listen for writers and producers elsewhere (`_route`) on first need, and tell
        the broker where (under ``cond``)."""
        if self.inlet is not None or sys.platform != "linux":
            return
        from fiberexec.multiprocessing._route import Inlet

        self.inlet = Inlet(self)
        self.send(InletAt(self.inlet.address))  # before anything it reads

    def subscribe(self, cid: int) -> None:
        with self.cond:
            self.subscribed[cid] += 1
            first = self.subscribed[cid] == 1
            if first:
                self._open_inlet()
        if first:
            self.send(Subscribe(cid))

    def unsubscribe(self, cid: int) -> None:
        with self.cond:
            self.subscribed[cid] -= 1
            last = self.subscribed[cid] == 0
            if last and self.inlet is not None:
                self.inlet.stop(cid)
        if last:
            with contextlib.suppress(ConnectionError):
                self.send(Unsubscribe(cid))

    def wait(self, cid: int, timeout: float | None) -> bool:
        """Whether an item or end-of-file for ``cid`` is here, waiting up to ``timeout``."""
        with self.cond:
            return self._await(lambda: self.inbox[cid] or cid in self.eof, timeout, cid)

    def take(self, cid: int) -> bytes:
        """The next item for ``cid`` (blocking); EOFError at end-of-file."""
        with self.cond:
            box = self.inbox[cid]
            if not box:
                self._await(lambda: box or cid in self.eof, None, cid)
            if box:
                item = box.popleft()
                if self.signals:
                    sig = self.signals.get(cid)
                    if sig is not None:
                        sig.set(bool(box) or cid in self.eof)
                return item
            if cid in self.eof:
                raise EOFError
        raise ConnectionError(self.why)

    def signal(self, cid: int) -> int:
        """A descriptor readable while pipe ``cid`` has data or EOF here (see `Signal`).

        Whoever waits on it does not read the stream: from now on a reader thread does."""
        with self.cond:
            sig = self.signals.get(cid)
            if sig is None:
                sig = self.signals[cid] = Signal()
                self.start_reader()
            sig.set(bool(self.inbox[cid]) or cid in self.eof or self.lost)
            return sig.r

    def drop_signal(self, cid: int) -> None:
        with self.cond:
            sig = self.signals.pop(cid, None)
        if sig is not None:
            sig.close()

    def settle(self, timeout: float) -> bool:
        """Before this process exits, up to ``timeout``: producers that sent its queues
        items directly take back what it did not take (and what this process sent to
        consumers directly that they did not take comes back, to go through the broker);
        writers told to stop sending here directly take back what it did not read."""
        deadline = _timing.Deadline(timeout)
        left = self.outlets is None or self.outlets.leave(timeout)
        with self.cond:
            inlet = self.inlet
            if inlet is None:
                return left
            for cid in self.lanes:
                inlet.stop(cid)
            return self.cond.wait_for(lambda: self.lost or not inlet.stopping(),
                                      deadline.left()) and left

    def finish(self, timeout: float) -> bool:
        """Before this process exits, over TCP: end what it sends on its direct connections
        to pipes' readers and from their writers (`_route`), then to the broker, and read on
        until each peer, having read all of it, closes its side, up to ``timeout`` (see
        `_links.half_close`: a busy peer would otherwise lose the last items sent). True if
        every peer closed in time."""
        deadline = _timing.Deadline(timeout)
        done = True
        for ends in (self.outlets, self.inlet):
            if ends is not None:
                done = ends.finish(deadline.left() or 0.0) and done
        if not half_close(self.conn.sock):
            return done
        with self.cond:
            return self._await(lambda: self.lost, deadline.left()) and done

    def start_reader(self) -> None:
        """From now on a thread reads the broker's frames as they come."""
        self.reader.start("fiberexec-mp-stream-reader")

    # -------------------------------------------------------------- queue consumption

    def _lane(self, cid: int) -> _Lane:
        lane = self.lanes.get(cid)
        if lane is None:
            lane = self.lanes[cid] = _Lane()
            self.start_reader()
            self._open_inlet()  # where producers elsewhere may send directly
            self._announce(cid, lane)
        return lane

    def _announce(self, cid: int, lane: _Lane) -> None:
        """Count what this process takes of queue ``cid`` in the tally page, and tell the
        broker where (under ``cond``); until it says it reads it, every take is reported."""
        page, lane.slot = self.count_slot()
        if page is not None and lane.slot is not None:
            with contextlib.suppress(ConnectionError):
                self.send(Tally(cid, lane.slot, page.nonce, page.path))

    def count_slot(self) -> tuple[TallyPage | None, int | None]:
        """This process's tally page and a slot of its own there, for a count another
        process reads (under ``cond``); no page where there can be none, no slot once
        it is full."""
        if self.tally is None:
            if not _tally.available():
                return None, None
            self.tally = TallyPage()
        return self.tally, self.tally.slot()

    def _tell(self, cid: int, lane: _Lane, settle: int = 0) -> None:
        """Send this lane's state (under ``cond``)."""
        lane.told = lane.consumed
        self.send(Want(cid, lane.consumed, lane.received, _wanted(lane, len(lane.items)),
                       WINDOW, settle))

    def told(self, cid: int) -> None:
        """Producers stopped sending queue ``cid`` here directly: the broker learns how
        many threads here wait (they did not say while items came directly; see `get`)."""
        lane = self.lanes.get(cid)
        if lane is not None:
            with contextlib.suppress(ConnectionError):
                self._tell(cid, lane)

    def task_done(self, cid: int) -> int | None:
        """``task_done()`` on `JoinableQueue` ``cid``, sent with no answer to wait for, if
        this process took more of its items than it marked done (then the queue has an
        item to mark: only other processes' extra calls meanwhile could have taken it):
        None. Else how many marks it sent so far: the caller asks the broker (which counts
        those first), and may be told that none is left."""
        with self.cond:
            lane = self.lanes.get(cid)
            if lane is None:
                return 0
            if lane.done >= lane.consumed:
                return lane.done
            lane.done += 1
            self.send(Done(cid))
            return None

    def get(self, cid: int, timeout: float | None) -> bytes | None:
        """The next item of queue ``cid``, waiting up to ``timeout``; None if none came.

        A get that gives up may have been sent an item already: the broker handed it to
        this waiting thread, and later items may go to others. So it says it waits no more
        and waits (`Timing.gave_up` at most) for the broker's word that all it sent before is
        here (`Settled`): what came for it, it takes, as the stdlib's get returns the item
        it read; else it returns None."""
        with self.cond:
            lane = self._lane(cid)
            settled = False
            if not lane.items:
                if self.lost:
                    raise ConnectionError(self.why)
                lane.waiting += 1
                try:
                    self._wait_item(cid, lane, timeout)
                    settled = not (lane.items or self.lost)
                    if settled:
                        self._settle(cid, lane)
                finally:
                    lane.waiting -= 1
                if not lane.items:
                    if self.lost:
                        raise ConnectionError(self.why)
                    return None
            item = self._take(cid, lane)
            if settled:  # it took what came for another waiting thread, maybe: the
                self._tell(cid, lane)  # broker learns exactly how many still wait
        return _handed(cid, item)

    def _settle(self, cid: int, lane: _Lane) -> None:
        """This waiting thread gives up (under ``cond``): tell the broker, and wait until
        what it sent for it before is here (see `get`)."""
        lane.settling += 1
        lane.settle += 1
        settle = lane.settle
        try:
            self._tell(cid, lane, settle)
            self._await(lambda: lane.items or lane.settled >= settle, _timing.TIMING.gave_up, cid)
        finally:
            lane.settling -= 1

    def _wait_item(self, cid: int, lane: _Lane, timeout: float | None) -> None:
        """Wait up to ``timeout`` for an item of queue ``cid`` (under ``cond``).

        The only consumer, fed ahead by the broker or directly by a producer, need not say
        it waits: the broker sends it items ahead anyway (see `_channels.Chan.dispatch`).
        If the broker stops feeding it ahead while it waits, it says so then."""
        deadline = _timing.Deadline(timeout)
        while True:
            silent = lane.fed
            if not silent and (self.inlet is None or not self.inlet.fed(cid)):
                self._tell(cid, lane)
            self._await(functools.partial(_arrived, lane, silent), deadline.left(), cid)
            if lane.items or self.lost or not silent or lane.fed or deadline.passed():
                return

    def holds(self, cid: int) -> bool:
        """Whether an item of queue ``cid`` is here, sent ahead or directly."""
        with self.cond:
            lane = self.lanes.get(cid)
            return lane is not None and bool(lane.items)

    def get_nowait(self, cid: int) -> bytes | None:
        """An item of queue ``cid`` already here, or None."""
        with self.cond:
            lane = self._lane(cid)
            if not lane.items:
                return None
            item = self._take(cid, lane)
        return _handed(cid, item)

    def _take(self, cid: int, lane: _Lane) -> Any:
        """The next item at hand (under ``cond``): bytes, or a `_route.Direct` to pass
        to `_handed` once ``cond`` is let go."""
        item = lane.items.popleft()
        if type(item) is bytes:
            lane.consumed += 1
            # counted before the item is returned: if this process ends, the broker puts
            # back exactly what it had not taken, and nothing is handed out twice
            if lane.slot is not None and self.tally is not None:
                self.tally.write(lane.slot, lane.consumed)
            if not lane.tallied or lane.consumed - lane.told >= REPORT:
                self._tell(cid, lane)  # the broker may send more ahead
            return item
        lane.direct -= 1
        return item.take()



def _wanted(lane: _Lane, at_hand: int) -> int:
    """Threads of ``lane`` that wait beyond ``at_hand`` items, those that gave up aside."""
    return max(0, lane.waiting - lane.settling - at_hand)


def _arrived(lane: _Lane, silent: bool) -> bool:
    """Whether a get waiting on ``lane`` may stop: an item came, or it waits ``silent``ly
    (fed ahead) and is no longer fed, so it must say that it waits."""
    return bool(lane.items) or (silent and not lane.fed)


def _handed(cid: int, item: Any) -> bytes:
    """What `Stream._take` took, once its producer knows (see `_route.Direct`)."""
    return item if type(item) is bytes else bytes(item.handed(cid))


_streams: dict[str, Stream] = {}
_streams_lock = threading.Lock()


def stream_for(endpoint: Endpoint) -> Stream | None:
    """This process's stream to ``endpoint``'s broker; None when that broker is here."""
    server = _local_servers.get(endpoint.address)
    if server is not None and server.secret == endpoint.secret:
        return None
    with _streams_lock:
        stream = _streams.get(endpoint.address)
        if stream is None or stream.lost:
            host, port, unix = endpoint.call(calls.OpenStream())[0]
            stream = _streams[endpoint.address] = Stream((host, port, unix), endpoint)
        return stream


def settle_all() -> None:
    """Before this process exits: let writers that sent here directly take back what was
    not read, and consumers this process sent to directly hand back what they did not take
    (see `Stream.settle`), then let each broker read what this process sent it (see
    `Stream.finish`), within `Timing.leave`; a warning says when they did not."""
    deadline = _timing.Deadline(_timing.TIMING.leave)
    with _streams_lock:
        streams = list(_streams.values())
    settled = [stream.settle(deadline.left() or 0.0) for stream in streams]
    settled += [stream.finish(deadline.left() or 0.0) for stream in streams]
    if not all(settled):
        log.warning("process %d exits before its pipe and queue connections settled "
                    "within %.0f s: a peer did not answer", os.getpid(),
                    _timing.TIMING.leave)
