"""The broker's side of the streams (see `_stream`): a `Peer` per connected process.

A peer's frames are read as `_links.Reader` says: by its serving thread, or by a thread here
blocked in ``recv()`` on a pipe end whose data comes from that peer, which reads the socket
itself (`Reader.lead`), so a message from another process reaches its reader with no thread in
between.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Protocol

from fiberexec.multiprocessing._frames import (
    Claim,
    Counted,
    Flush,
    Frame,
    Holder,
    InletAt,
    Put,
    Release,
    Returned,
    Subscribe,
    Tally,
    Unsubscribe,
    Want,
    decode,
    unexpected,
)
from fiberexec.multiprocessing._links import STREAM, Reader, Wire, shared
from fiberexec.multiprocessing._tally import TallyView


class Peer(Reader):
    """The broker's end of one process's stream (read as `Reader` says); sends are
    serialised."""

    def __init__(self, conn: Wire, apply: Callable[[Peer, Frame], None],
                 lost: Callable[[Peer], None]) -> None:
        super().__init__(conn, lambda raw: apply(self, decode(raw)), lambda: lost(self))
        self.lock = threading.Lock()  # serialises sends
        self.holder: str | None = None  # the process token it sent first
        self.inlet = ""  # where writers elsewhere may send its pipes directly (`_route`)
        self.gone = False  # a send to it failed: its process is ending
        self.tally: TallyView | None = None  # what its process took of queues here
        self.slots: dict[int, int] = {}  # queue -> its slot in that page

    def send(self, frame: Frame) -> None:
        with self.lock:
            self.conn.send(frame)

    def close(self) -> None:
        super().close()
        if self.tally is not None:
            self.tally.close()


class Channels(Protocol):
    """What a hub does to its broker's channels as frames come (`_broker.Broker`)."""

    secret: bytes

    def append(self, cid: int, body: bytes, source: Peer | None = None) -> None: ...

    def subscribe(self, cid: int, peer: Peer) -> None: ...

    def unsubscribe(self, cid: int, peer: Peer) -> None: ...

    def claim(self, cid: int, ticket: str, holder: str) -> None: ...

    def unref(self, cid: int, holder: str, count: int = 1) -> None: ...

    def flush(self, cid: int, nonce: bytes, inlet: str) -> None: ...

    def add_inlet(self, peer: Peer, address: str) -> None: ...

    def lease(self, peer: Peer, want: Want) -> None: ...

    def lease_returned(self, peer: Peer, returned: Returned) -> None: ...

    def tally(self, peer: Peer, tally: Tally) -> None: ...

    def counted(self, peer: Peer, counted: Counted) -> None: ...

    def peer_lost(self, peer: Peer, holder: str | None) -> None: ...


class Hub:
    """Accepts streams for a broker and applies their frames to its channels."""

    def __init__(self, broker: Channels, secret: bytes, port: int, advertise: str) -> None:
        """Streams come to this process's listener, as the broker's calls do (on TCP at
        their ``port``); processes of this host (and network namespace) connect to its
        abstract Unix socket: no TCP stack on every message."""
        self.broker = broker
        self.offer = shared(secret, STREAM, self._admit)
        self.address = (advertise, port, self.offer.unix)

    def _admit(self, sock: socket.socket) -> None:
        """Serve an authenticated stream (in the thread that accepted it)."""
        Peer(Wire(sock), self._apply, self._lost).run()

    def _lost(self, peer: Peer) -> None:
        self.broker.peer_lost(peer, peer.holder)

    def _apply(self, peer: Peer, frame: Frame) -> None:  # noqa: PLR0912 (a case a kind)
        broker = self.broker
        match frame:
            case Put(cid, data):
                broker.append(cid, data, peer)
            case Subscribe(cid):
                broker.subscribe(cid, peer)
            case Unsubscribe(cid):
                broker.unsubscribe(cid, peer)
            case Claim(cid, ticket):
                broker.claim(cid, ticket, peer.holder or "")
            case Release(cid):
                broker.unref(cid, peer.holder or "")
            case Holder(token):
                peer.holder = token
            case Flush(cid, nonce, inlet):
                broker.flush(cid, nonce, inlet)
            case InletAt(address):
                broker.add_inlet(peer, address)
            case Want():
                broker.lease(peer, frame)
            case Returned():
                broker.lease_returned(peer, frame)
            case Tally():
                broker.tally(peer, frame)
            case Counted():
                broker.counted(peer, frame)
            case _:
                raise unexpected("a broker's stream", frame)

    def close(self) -> None:
        self.offer.withdraw()
