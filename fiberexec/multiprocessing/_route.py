"""Direct connections between two processes that are not the creator of a pipe or queue.

A pipe created in process B and held by processes A (writing) and R (reading) would
otherwise be relayed by B: A's stream to B, then B's stream to R (see `_stream`). Here
A sends its items to R itself, over a connection the broker only introduces:

    R, reading a pipe of B, listens (`Inlet`, on R's one listener: an abstract Unix
      socket for this host and network namespace, and TCP when R reaches B over a
      network, see `_links`) and tells B where (`InletAt`)
    A, on its first send, asks B for the reader's address (``"route"``), connects,
      proves the broker's secret (the handshake of `_links`, before anything is read),
      and says `Hello` for the pipe; R answers `Ack`
    A -> B: `Flush` after what A relayed so far; B -> R: `Flushed` once all of it has
      been handed to R (``ok``), or not ``ok`` when R no longer reads the pipe there
    A -> R: items, directly. R holds them until `Flushed`: nothing A sent through the
      relay can come after something it sent directly.

R stops reading (its end closed, its process ends, another process reads the pipe:
B says `Unroute`, or `Flushed` was not ok): R asks A to `Stop`; A answers
`Stopped` after its last direct item; R sends back (`Return`) every item it had not
accepted since, and A puts them to B, in order, before anything it sends next, which goes
through B again (A asks B for a route again later, see `REQUERY`).

End-of-file comes from B (it counts the writers). R files it only once every writer
routed to it has answered a `Sync` sent after it (so every item that writer sent
directly is in), or its connection has closed. A connection that closes (its process
ended) ends the routes over it: A sends through B again; R sends what it had not accepted
from a stopping writer to B itself. A process that ends closes its TCP connections here
by halves (`finish`): it ends what it sends, then reads on until the peer has read it all
and closed, so a `Sync` that comes late finds it still there (a closed TCP socket answers
it with a reset, and the kernels drop what was still in flight).

An unbounded queue of B goes the same way from a producer A to its consumer R while R is
its only consumer (B routes it only then). The differences:

- `Flushed` comes once the items B held at the `Flush` have been sent to R (as R's
  window allows; see `_channels.Chan.dispatch`), so they come before A's direct ones.
- Items wait in R's queue lane among those B sends ahead, and are counted by B's
  ``qsize()`` (it asks R, `Count`). A keeps a copy of each until it learns that R took
  it, before R hands it out: R counts what it takes of A's items in a slot of its tally
  page (`_tally`), offered with `Tally`; A maps it where it can (`Tallied`) and drops the
  copies of what was taken as it puts; elsewhere R says `Taken` for each. If R's
  process dies, A reads the count to the last and puts the other copies to B, so what
  R had not taken stays in the queue, as in the standard library's pipe.
- A second consumer (another process, or a get in B) makes B say `Unroute`: R stops its
  producers and sends back, with `Return`, the items it had not taken, which A puts to B.
- A producer that exits says `Stopped` unasked, and R sends back what it had not taken
  (so a consumer that dies later cannot lose it); a consumer that exits stops its
  producers likewise (`_stream.Stream.settle`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._errors import AuthenticationError
from fiberexec.multiprocessing._frames import (
    NONCE,
    Ack,
    Flush,
    Frame,
    Hello,
    Item,
    Nack,
    Put,
    Return,
    Stop,
    Stopped,
    Sync,
    Synced,
    Taken,
    Tallied,
    Tally,
    decode,
    unexpected,
)
from fiberexec.multiprocessing._links import (
    PIPE,
    Reader,
    Wake,
    Wire,
    dial,
    half_close,
    outward_ip,
    shared,
    split_address,
    tcp_text,
    thread_wake,
)
from fiberexec.multiprocessing._stream import Stream
from fiberexec.multiprocessing._tally import TallyPage, TallyView

log = logging.getLogger("fiberexec.multiprocessing")


class Link:
    """One connection between a writing process and a reading process; sends are
    serialised by ``lock``."""

    def __init__(self, wire: Wire, address: str = "") -> None:
        self.wire = wire
        self.address = address
        self.lock = threading.Lock()
        self.closed = False
        self.routes: dict[int, Route] = {}  # on the writer's side: the pipes routed over it
        self.views: dict[bytes, TallyView] = {}  # on the writer's side: consumers' counts
        self.reader: Reader | None = None  # what reads it (the answers, on the writer's side)

    def send(self, frame: Frame) -> None:
        with self.lock:
            self.wire.send(frame)


def finish(links: Iterable[Link], cond: threading.Condition, timeout: float) -> bool:
    """Before this process exits: end what it sends on each of ``links`` that is TCP (after
    any send in progress) and wait, up to ``timeout``, until the peer, having read it all,
    closes its side (the link's reader then marks it closed under ``cond``, and notifies
    it). See `_links.half_close`."""
    deadline = _timing.Deadline(timeout)
    ending, done = [], True
    for link in links:
        # (a send blocked on a peer that reads no more keeps the lock: not waited for)
        if not link.lock.acquire(timeout=deadline.left() or 0.0):
            done = False
            continue
        try:
            if not link.closed and half_close(link.wire.sock):
                ending.append(link)
        finally:
            link.lock.release()
    with cond:
        return cond.wait_for(lambda: all(link.closed for link in ending),
                             deadline.left()) and done


# ------------------------------------------------------------------------- reading side


class Direct:
    """A queue item a producer sent here directly, waiting in the consumer's lane.

    Its producer keeps a copy until it learns that the item was taken: `take` (under the
    stream's ``cond``) counts it, in the flow's slot of this process's tally page where
    the producer reads it (`_tally`), else `handed` tells it (`Taken`) before the item is
    handed out, without ``cond`` (the producer's connection thread must be free to read:
    it never waits for this process while we wait for it). Either way the count is out
    before the item is, so it is never handed out twice."""

    __slots__ = ("data", "flow", "taken")

    def __init__(self, data: bytes, flow: Inflow) -> None:
        self.data = data
        self.flow = flow
        self.taken = 0

    def take(self) -> Direct:
        flow = self.flow
        flow.taken += 1
        self.taken = flow.taken
        if flow.page is not None and flow.slot is not None:
            flow.page.write(flow.slot, flow.taken)
        return self

    def handed(self, cid: int) -> bytes:
        flow = self.flow
        if not (flow.counted or flow.link.closed):
            with contextlib.suppress(OSError):
                flow.link.send(Taken(cid, self.taken))
        return self.data


@dataclass
class Inflow:
    """One writer's direct items for one pipe read here."""

    link: Link
    nonce: bytes
    flushed: bool = False  # the broker said every relayed item of this writer is here
    stopping: bool = False  # this process asked the writer to stop (items go back)
    sync_sent: bool = False
    synced: bool = False  # answered a `Sync` sent after end-of-file
    held: list[bytes] = field(default_factory=list)  # items not accepted (yet)
    taken: int = 0  # queue: items of this writer taken here in all
    page: TallyPage | None = None  # queue: where ``taken`` is counted for the writer...
    slot: int | None = None  # ...in this slot
    counted: bool = False  # the writer reads it (`Tallied`): no `Taken` per item

    @property
    def settled(self) -> bool:
        """Nothing more from this writer can reach the reader before end-of-file."""
        return self.stopping or (self.flushed and self.synced)


class Inlet:
    """Where writers of pipes read in this process connect (see the module).

    Its state is guarded by the stream's ``cond``; its threads (one per connection, from
    this process's listener) file items into the stream's inbox as its own reader does."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.flows: dict[int, dict[Link, Inflow]] = {}
        self.eof_wait: set[int] = set()  # pipes whose end-of-file waits for `settled`
        self.leaders: dict[int, Wake] = {}  # pipes a thread here reads directly (`lead`)
        self.links: set[Link] = set()  # writers' connections, open
        # this process's listener (see `_links`), on TCP too when writers on other hosts
        # may reach it
        self.offer = shared(stream.secret, PIPE, self._admit)
        self.address = self.offer.unix
        ip = outward_ip(stream.endpoint.address)
        if ip is not None:
            try:
                self.address += "|" + tcp_text(ip, self.offer.listen_tcp(ip))
            except OSError as exc:
                log.warning("pipe writers on other hosts go through the creator: cannot "
                            "listen on %s (%s)", ip, exc)

    def _admit(self, sock: socket.socket) -> None:
        """Serve an authenticated writer's connection (in the thread that accepted it)."""
        link = Link(Wire(sock))
        # read by this thread, or by a thread here waiting for its items (`lead`)
        reader = link.reader = Reader(link.wire, functools.partial(self._on, link),
                                      functools.partial(self._lost_link, link))
        with self.stream.cond:
            self.links.add(link)
        reader.run()

    def _lost_link(self, link: Link) -> None:
        with self.stream.cond:
            self.links.discard(link)
            self._lost(link)
            self.stream.cond.notify_all()

    def finish(self, timeout: float) -> bool:
        """This process ends: see `finish` (after `Stream.settle`: nothing more is sent)."""
        with self.stream.cond:
            links = list(self.links)
        return finish(links, self.stream.cond, timeout)

    def _on(self, link: Link, raw: bytes) -> None:
        frame = decode(raw)
        with self.stream.cond:
            self._apply(link, frame)
            self.stream.cond.notify_all()

    def lead(self, cid: int, timeout: float | None) -> bool:
        """A thread here waits for ``cid`` (under the stream's ``cond``): if its items come
        directly from one writer, read that connection in this thread until something
        was applied, ``cid`` is woken (`wake`) or ``timeout`` passes, as the broker's
        threads read a stream they wait on (`_links.Reader`): no thread in between.
        False if it cannot (the caller then waits on ``cond``)."""
        flows = self.flows.get(cid)
        if flows is None or len(flows) != 1 or cid in self.leaders:
            return False
        ((link, flow),) = flows.items()
        reader = link.reader
        if reader is None or not (flow.flushed and not flow.stopping):
            return False
        self.leaders[cid] = thread_wake()
        try:
            return reader.try_lead(self.stream.cond, self.leaders[cid], timeout,
                                   keep=cid not in self.stream.signals)
        finally:
            del self.leaders[cid]

    def wake(self, cid: int | None = None) -> None:
        """``cid`` (None: every pipe) became ready some other way: its leader stops."""
        for key, wake in list(self.leaders.items()):
            if cid is None or key == cid:
                wake.wake()

    def _apply(self, link: Link, frame: Frame) -> None:
        stream = self.stream
        match frame:
            case Item(cid, data):
                flow = self.flows[cid][link]
                if flow.flushed and not flow.stopping:
                    self._deliver(cid, flow, data)
                else:
                    flow.held.append(data)
            case Hello(cid, nonce):
                self._hello(link, cid, nonce)
            case Tallied(cid):
                tallied = self.flows.get(cid, {}).get(link)
                if tallied is not None:
                    tallied.counted = True
            case Stopped(cid):  # asked for, or the writer's process ends
                stopped = self._drop(link, cid)
                link.send(Return(cid, tuple(self._unread(cid, stopped))))
                self._settle(cid)
                if cid in stream.lanes:
                    stream.told(cid)
            case Synced(cid):
                synced = self.flows.get(cid, {}).get(link)
                if synced is not None:
                    synced.synced = True
                    self._settle(cid)
            case _:
                raise unexpected("a pipe's reader", frame)

    def _hello(self, link: Link, cid: int, nonce: bytes) -> None:
        stream = self.stream
        if (stream.subscribed[cid] > 0 or cid in stream.lanes) and not stream.lost:
            flow = self.flows.setdefault(cid, {})[link] = Inflow(link, nonce)
            stream.start_reader()  # the broker's frames must be read as they come
            link.send(Ack(cid))
            if cid in stream.lanes:
                self._offer_count(cid, flow)
        else:
            link.send(Nack(cid))

    def _offer_count(self, cid: int, flow: Inflow) -> None:
        """A producer of queue ``cid`` may read what it takes here in the tally page,
        instead of a `Taken` per item (under the stream's ``cond``)."""
        page, slot = self.stream.count_slot()
        if page is not None and slot is not None:
            flow.page, flow.slot = page, slot
            flow.link.send(Tally(cid, slot, page.nonce, page.path))

    def _deliver(self, cid: int, flow: Inflow, data: bytes) -> None:
        lane = self.stream.lanes.get(cid)
        if lane is None:  # a pipe
            self.stream.deliver(cid, data)
        else:
            lane.items.append(Direct(data, flow))
            lane.direct += 1

    def _unread(self, cid: int, flow: Inflow | None) -> list[bytes]:
        """What a stopped writer sent here that was not taken: what was held, and for a
        queue, its items not yet taken from the lane (they go back to it)."""
        if flow is None:
            return []
        lane = self.stream.lanes.get(cid)
        if lane is None or not lane.direct:
            return flow.held
        mine = [item for item in lane.items if type(item) is Direct and item.flow is flow]
        if mine:
            lane.items = deque(
                item for item in lane.items if not (type(item) is Direct and item.flow is flow))
            lane.direct -= len(mine)
        return [item.data for item in mine] + flow.held

    def fed(self, cid: int) -> bool:
        """Whether a producer sends queue ``cid`` here directly (it is its only consumer)."""
        return any(flow.flushed and not flow.stopping
                   for flow in self.flows.get(cid, {}).values())

    def held(self, cid: int) -> int:
        """Items writers sent ``cid`` directly that wait here for the broker's word."""
        return sum(len(flow.held) for flow in self.flows.get(cid, {}).values())

    def _drop(self, link: Link, cid: int) -> Inflow | None:
        flows = self.flows.get(cid)
        flow = flows.pop(link, None) if flows is not None else None
        if flows is not None and not flows:
            del self.flows[cid]
        return flow

    def _give_back(self, cid: int, flow: Inflow) -> None:
        """The writer is gone: items of it not accepted here go to the broker (in order)."""
        for item in flow.held:
            with contextlib.suppress(ConnectionError):
                self.stream.send(Put(cid, item))
        flow.held.clear()

    def _lost(self, link: Link) -> None:
        link.closed = True
        for cid in list(self.flows):
            flow = self.flows[cid].get(link)
            if flow is None:
                continue
            if flow.flushed or flow.stopping:
                self._give_back(cid, flow)
                self._drop(link, cid)
            elif not flow.held:
                self._drop(link, cid)
            # else: the broker's Flushed is on its way (the writer sent Flush first)
            self._settle(cid)

    # ------------------------------------------------------------ from the broker's stream

    def flushed(self, cid: int, ok: bool, nonce: bytes) -> None:
        for link, flow in list(self.flows.get(cid, {}).items()):
            if flow.nonce != nonce or flow.stopping:
                continue
            if not ok:
                if link.closed:
                    self._give_back(cid, flow)
                    self._drop(link, cid)
                else:
                    self._stop(cid, flow)
            else:
                for item in flow.held:
                    self._deliver(cid, flow, item)
                flow.held.clear()
                flow.flushed = True
                if link.closed:
                    self._drop(link, cid)
                elif cid in self.eof_wait:
                    self._sync(flow, cid)
            self._settle(cid)

    def stop(self, cid: int) -> None:
        """This process no longer reads ``cid``: its writers send through the broker."""
        for flow in list(self.flows.get(cid, {}).values()):
            self._stop(cid, flow)

    def _stop(self, cid: int, flow: Inflow) -> None:
        if flow.stopping:
            return
        flow.stopping = True
        try:
            flow.link.send(Stop(cid))
        except OSError:  # the writer is gone; `_lost` follows
            pass

    def _sync(self, flow: Inflow, cid: int) -> None:
        if flow.flushed and not (flow.stopping or flow.sync_sent or flow.link.closed):
            flow.sync_sent = True
            try:
                flow.link.send(Sync(cid))
            except OSError:
                pass

    def eof(self, cid: int) -> bool:
        """The broker says ``cid`` has no writer left: whether to file end-of-file now."""
        flows = self.flows.get(cid)
        if not flows:
            return True
        self.eof_wait.add(cid)
        for flow in list(flows.values()):
            self._sync(flow, cid)
        return False

    def _settle(self, cid: int) -> None:
        if cid in self.eof_wait and all(
                flow.settled for flow in self.flows.get(cid, {}).values()):
            self.eof_wait.discard(cid)
            self.stream.end(cid)

    def stopping(self) -> bool:
        return any(flow.stopping for flows in self.flows.values() for flow in flows.values())


# ------------------------------------------------------------------------- writing side

HELLOING, ACKED, NACKED, DIRECT, STOPPING, DEAD = range(6)


class Route:
    """One pipe this process writes, or queue it puts to, sent directly over ``link``."""

    __slots__ = ("acked", "acks", "direct", "link", "nonce", "slot", "state", "unacked",
                 "view")

    def __init__(self, link: Link, queue: bool) -> None:
        self.link = link
        self.state = HELLOING
        self.direct = False  # state == DIRECT, read without the lock on the fast path
        self.nonce = secrets.token_bytes(NONCE)
        # a queue's items sent directly and not yet taken: if the consumer's process
        # ends, they go to the broker instead of being lost with it. Under ``acks``, never
        # held while waiting (the thread reading the consumer's answers takes it)
        self.unacked: deque[bytes] | None = deque() if queue else None
        self.acked = 0
        self.acks = threading.Lock()
        self.view: TallyView | None = None  # the consumer's count of what it took, and
        self.slot = 0  # its slot there (`Tally`)

    def sent(self, data: bytes) -> None:
        if self.unacked is not None:
            with self.acks:
                self.unacked.append(data)
                if self.view is not None:  # drop the copies of what it took since
                    self._taken(self.view.read(self.slot))

    def taken(self, taken: int | None = None) -> None:
        """The consumer took ``taken`` of this route's items in all (None: as many as its
        tally page says): drop their copies."""
        if self.unacked is not None:
            with self.acks:
                self._taken(taken if taken is not None or self.view is None
                            else self.view.read(self.slot))

    def _taken(self, taken: int | None) -> None:
        if taken is not None and self.unacked is not None:
            for _ in range(min(taken - self.acked, len(self.unacked))):
                self.unacked.popleft()
            self.acked = max(self.acked, taken)

    def forget(self) -> list[bytes]:
        """Stop sending directly (under ``link.lock``, or after `Stopped` was sent); the
        items sent that were not taken."""
        self.direct = False
        if self.unacked is None:
            return []
        with self.acks:
            items = list(self.unacked)
            self.unacked.clear()
        return items


class Outlets:
    """The pipes this process writes to readers in other processes (see the module).

    ``routes`` maps a pipe to its `Route`, or to the time until which it is sent through
    the broker. ``cond`` guards it, serialises every send that does not go directly, and
    changes of route, so that a thread's items never overtake one another."""

    def __init__(self, stream: Stream, clock: _timing.Clock = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.cond = threading.Condition(threading.Lock())
        self.routes: dict[int, Route | float] = {}
        self.links: dict[str, Link] = {}
        self.unreachable: set[str] = set()  # readers on another host or network namespace
        self.backoff: dict[int, float] = {}  # the next wait before asking for a route

    def put(self, cid: int, data: bytes, queue: bool = False) -> None:
        route = self.routes.get(cid)
        if isinstance(route, Route) and route.direct and self._direct(route, cid, data):
            return
        with self.cond:
            while True:
                route = self.routes.get(cid)
                if isinstance(route, Route):
                    if route.state == DIRECT:
                        if self._direct(route, cid, data):
                            return
                        continue
                    if route.state in (ACKED, STOPPING):  # settles soon: wait for it
                        self.cond.wait(_timing.TIMING.settle)
                        continue
                    if route.state != HELLOING:  # the reader refused, or is gone
                        self._relay_for_now(cid, route)
                elif route is None or self.clock() >= route:
                    self._establish(cid, queue)
                    continue
                break
            self.stream.send(Put(cid, data))

    def _direct(self, route: Route, cid: int, data: bytes) -> bool:
        link = route.link
        with link.lock:
            if not route.direct:
                return False
            try:
                link.wire.send(Item(cid, data))
            except OSError:  # the reader's process is gone: what a pipe's had is lost
                route.direct = False  # with it (a queue's come back: `_serve`)
                route.state = DEAD
                link.closed = True
                return False
            route.sent(data)
            return True

    def _relay_for_now(self, cid: int, route: Route | None = None) -> None:
        if route is not None:
            route.link.routes.pop(cid, None)
        if route is None or self.routes.get(cid) is route:
            wait = self.backoff.get(cid, _timing.TIMING.requery)
            self.backoff[cid] = min(wait * 2, _timing.TIMING.requery_most)
            self.routes[cid] = self.clock() + wait

    def _establish(self, cid: int, queue: bool) -> None:
        """Ask the broker where ``cid`` is read and route it there (under ``cond``, which
        is let go while waiting: other threads send through the broker meanwhile)."""
        self._relay_for_now(cid)
        link = self._link_for(cid)
        if link is None:
            return
        route = Route(link, queue)
        self.routes[cid] = link.routes[cid] = route
        try:
            link.send(Hello(cid, route.nonce))
        except OSError:
            self._relay_for_now(cid, route)
            return
        # (an answer, a stop and the link's loss notify ``cond``)
        self.cond.wait_for(lambda: route.state != HELLOING or link.closed,
                           _timing.TIMING.hello)
        if route.state == ACKED:
            # after everything relayed so far; until the broker passes it on, the reader
            # holds what comes directly
            self.stream.send(Flush(cid, route.nonce, link.address))
            with link.lock:
                route.state = DIRECT
                route.direct = True
            self.cond.notify_all()
        elif route.state != STOPPING:  # refused, gone, or no answer in time
            route.state = DEAD
            self._relay_for_now(cid, route)

    def _link_for(self, cid: int) -> Link | None:
        """The connection to ``cid``'s reader, if it is elsewhere on this host (under
        ``cond``, which is let go while asking the broker)."""
        self.cond.release()
        try:
            address = self.stream.endpoint.call(calls.Route(cid))[0]
        except Exception:  # the broker is gone: the relay will say so
            address = ""
        finally:
            self.cond.acquire()
        if address is None:  # a queue its creator consumes: relayed for good
            self.routes[cid] = math.inf
            return None
        if not address or address in self.unreachable:
            return None
        link = self.links.get(address)
        if link is not None and not link.closed:
            return link
        self.cond.release()
        try:
            sock: socket.socket | None = dial(self.stream.secret, *split_address(address),
                                              service=PIPE)
        except (OSError, AuthenticationError, EOFError):
            sock = None
        finally:
            self.cond.acquire()
        if sock is None:
            self.unreachable.add(address)
            return None
        link = Link(Wire(sock), address)
        self.links[address] = link
        # the reader's answers are read by a thread of their own, which sends no items
        link.reader = Reader(link.wire, functools.partial(self._apply, link),
                             functools.partial(self._lost, link))
        link.reader.start("fiberexec-mp-route")
        return link

    def _lost(self, link: Link) -> None:
        with self.cond:
            link.closed = True
            for cid, route in list(link.routes.items()):
                route.taken()  # what its tally page says it took, to the last
                with link.lock:
                    untaken = route.forget()
                    route.state = DEAD
                self._resend(cid, untaken)
                self._relay_for_now(cid, route)
            if self.links.get(link.address) is link:
                del self.links[link.address]
            for view in link.views.values():
                view.close()
            self.cond.notify_all()

    def _apply(self, link: Link, raw: bytes) -> None:
        frame = decode(raw)
        match frame:
            case Taken(cid, taken):  # the most frequent: one per queue item taken
                route = link.routes.get(cid)
                if route is not None:
                    route.taken(taken)
            case Tally(cid, slot, nonce, path):
                self._read_count(link, cid, slot, nonce, path)
            case Ack(cid) | Nack(cid):
                with self.cond:
                    route = link.routes.get(cid)
                    if route is not None and route.state == HELLOING:
                        route.state = ACKED if type(frame) is Ack else NACKED
                        self.cond.notify_all()
                        return
                if type(frame) is Ack:  # too late: we send through the broker; the reader
                    link.send(Stopped(cid))  # forgets us
            case Stop(cid):  # answered by another thread: this one keeps reading, so a
                # sender blocked on a full connection (holding its lock) is never waited for
                threading.Thread(target=self._stop, args=(link, cid), daemon=True,
                                 name="fiberexec-mp-route").start()
            case Return(cid, items):
                self._returned(link, cid, items)
            case Sync(cid):
                link.send(Synced(cid))
            case _:
                raise unexpected("a pipe's writer", frame)

    @staticmethod
    def _read_count(link: Link, cid: int, slot: int, nonce: bytes, path: str) -> None:
        """The consumer counts what it takes of our items of ``cid`` in its tally page:
        map it if this process can (same host, PID namespace and user), and say so."""
        route = link.routes.get(cid)
        if route is None or route.unacked is None:
            return
        view = link.views.get(nonce)
        if view is None:
            try:
                view = link.views[nonce] = TallyView(path, nonce)
            except OSError as exc:  # it goes on saying `Taken` for each
                log.debug("a consumer's tally page cannot be read here: %s", exc)
                return
        with route.acks:
            route.view, route.slot = view, slot
        with contextlib.suppress(OSError):
            link.send(Tallied(cid))

    def _stop(self, link: Link, cid: int) -> None:
        with self.cond:
            self._stopping(link, cid, link.routes.get(cid))
            self.cond.notify_all()  # (a route still saying hello waits for its answer)

    @staticmethod
    def _stopping(link: Link, cid: int, route: Route | None) -> bool:
        """Send ``cid`` through the broker from now on, and tell the reader after the
        last direct item (under ``cond``); False if the connection is closed (`_serve`
        then sends what was not taken through the broker)."""
        with link.lock:
            if route is not None:
                route.direct = False
                route.state = STOPPING
            try:
                link.wire.send(Stopped(cid))
            except OSError:
                return False
        return True

    def _returned(self, link: Link, cid: int, items: Sequence[bytes]) -> None:
        """The reader stopped ``cid``'s route and sent back what it had not taken (for a
        queue, exactly the route's unacked items): they go through the broker."""
        with self.cond:
            route = link.routes.get(cid)
            if route is not None:
                route.forget()
            self._resend(cid, items)
            if route is not None and route.state == STOPPING:
                self._relay_for_now(cid, route)
                route.state = DEAD  # ended: `leave` waits for no more from it
            self.cond.notify_all()

    def _resend(self, cid: int, items: Sequence[bytes]) -> None:
        """Put items that came back through the broker, in order (under ``cond``, so that
        they go before anything sent next)."""
        for item in items:
            with contextlib.suppress(ConnectionError):
                self.stream.send(Put(cid, item))

    def leave(self, timeout: float) -> bool:
        """This process ends: the consumers of queues it sent items to directly hand back
        those they have not taken, which then go through the broker (a consumer that
        dies later cannot lose them); waits up to ``timeout``."""
        with self.cond:
            leaving = []
            for cid, route in self.routes.items():
                if not isinstance(route, Route):
                    continue
                route.taken()  # what its tally page says was taken needs no stop
                if route.unacked and route.state == DIRECT and (
                        self._stopping(route.link, cid, route)):
                    leaving.append(route)
            return self.cond.wait_for(lambda: all(
                route.state != STOPPING or route.link.closed for route in leaving), timeout)

    def finish(self, timeout: float) -> bool:
        """This process ends: see `finish` (after `leave`; what its readers' connections
        close on still goes through the broker, before the stream to it ends)."""
        with self.cond:
            links = list(self.links.values())
        return finish(links, self.cond, timeout)
