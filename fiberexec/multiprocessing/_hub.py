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

from fiberexec.multiprocessing import _stream as st
from fiberexec.multiprocessing._links import STREAM, Listener, Reader, Wire
from fiberexec.multiprocessing._stream import (
    _COUNTED,
    _HEAD,
    _LEN,
    _RETURNED,
    _WANT,
    COUNT,
    EOF,
    FEED,
    FLUSHED,
    ITEM,
    ITEMS,
    NONCE,
    REVOKE,
    TALLIED,
    UNROUTE,
)
from fiberexec.multiprocessing._tally import TallyView


class Peer(Reader):
    """The broker's end of one process's stream (read as `Reader` says); sends are
    serialised."""

    def __init__(self, conn: Wire, apply: Callable[[Peer, bytes], None],
                 lost: Callable[[Peer], None]) -> None:
        super().__init__(conn, lambda frame: apply(self, frame), lambda: lost(self))
        self.lock = threading.Lock()  # serialises sends
        self.holder: str | None = None  # the process token it sent first
        self.inlet = ""  # where writers elsewhere may send its pipes directly (`_route`)
        self.gone = False  # a send to it failed: its process is ending
        self.tally: TallyView | None = None  # what its process took of queues here
        self.slots: dict[int, int] = {}  # queue -> its slot in that page

    # ------------------------------------------------------------------ sending

    def send_item(self, cid: int, body: bytes) -> None:
        with self.lock:
            self.conn.send_frame(ITEM, cid, body)

    def send_eof(self, cid: int) -> None:
        with self.lock:
            self.conn.send_frame(EOF, cid)

    def send_items(self, cid: int, items: list[bytes]) -> None:
        body = b"".join(part for item in items for part in (_LEN.pack(len(item)), item))
        with self.lock:
            self.conn.send_frame(ITEMS, cid, body)

    def send_revoke(self, cid: int) -> None:
        with self.lock:
            self.conn.send_frame(REVOKE, cid)

    def send_flushed(self, cid: int, ok: bool, nonce: bytes) -> None:
        with self.lock:
            self.conn.send_frame(FLUSHED, cid, (b"1" if ok else b"0") + nonce)

    def send_unroute(self, cid: int) -> None:
        with self.lock:
            self.conn.send_frame(UNROUTE, cid)

    def send_feed(self, cid: int, on: bool) -> None:
        with self.lock:
            self.conn.send_frame(FEED, cid, b"1" if on else b"0")

    def send_tallied(self, cid: int) -> None:
        with self.lock:
            self.conn.send_frame(TALLIED, cid)

    def send_count(self, cid: int, asked: int) -> None:
        with self.lock:
            self.conn.send_frame(COUNT, cid, _COUNTED.pack(asked, 0))

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

    def lease(self, cid: int, peer: Peer, state: tuple[int, int, int, int]) -> None: ...

    def lease_returned(self, cid: int, peer: Peer, consumed: int, wanted: int,
                       kept: int) -> None: ...

    def tally(self, cid: int, peer: Peer, body: bytes) -> None: ...

    def counted(self, cid: int, peer: Peer, asked: int, direct: int) -> None: ...

    def peer_lost(self, peer: Peer, holder: str | None) -> None: ...


class Hub:
    """Accepts streams for a broker and applies their frames to its channels."""

    def __init__(self, broker: Channels, listener: Listener, advertise: str) -> None:
        """Streams come to the broker's own ``listener`` (its calls' too); processes of
        this host (and network namespace) connect to its abstract Unix socket: no TCP
        stack on every message."""
        self.broker = broker
        self.listener = listener
        listener.offer(STREAM, self._admit)
        self.address = (advertise, listener.port, listener.unix)

    def _admit(self, sock: socket.socket) -> None:
        """Serve an authenticated stream (in the thread that accepted it)."""
        Peer(Wire(sock), self._apply, self._lost).run()

    def _lost(self, peer: Peer) -> None:
        self.broker.peer_lost(peer, peer.holder)

    def _apply(self, peer: Peer, frame: bytes) -> None:
        tag, cid = _HEAD.unpack_from(frame)
        body = frame[_HEAD.size:]
        broker = self.broker
        match tag:
            case st.PUT:
                broker.append(cid, body, peer)
            case st.SUBSCRIBE:
                broker.subscribe(cid, peer)
            case st.UNSUBSCRIBE:
                broker.unsubscribe(cid, peer)
            case st.CLAIM:
                broker.claim(cid, body.decode(), peer.holder or "")
            case st.RELEASE:
                broker.unref(cid, peer.holder or "")
            case st.TOKEN:
                peer.holder = body.decode()
            case st.FLUSH:
                broker.flush(cid, body[:NONCE], body[NONCE:].decode())
            case st.INLET:
                broker.add_inlet(peer, body.decode())
            case _:
                self._apply_consumer(peer, tag, cid, body)

    def _apply_consumer(self, peer: Peer, tag: bytes, cid: int, body: bytes) -> None:
        """A queue consumer's frame."""
        broker = self.broker
        match tag:
            case st.WANT:
                broker.lease(cid, peer, _WANT.unpack(body))
            case st.RETURNED:
                broker.lease_returned(cid, peer, *_RETURNED.unpack(body))
            case st.TALLY:
                broker.tally(cid, peer, body)
            case st.COUNTED:
                broker.counted(cid, peer, *_COUNTED.unpack(body))
            case _:
                raise ValueError(f"unknown stream frame {tag!r}")

    def close(self) -> None:
        self.listener.withdraw(STREAM)
