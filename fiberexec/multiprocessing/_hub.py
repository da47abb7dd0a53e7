"""The broker's side of the streams (see `_stream`): a `Peer` per connected process.

Each peer's frames are read by one thread at a time, the holder of its ``role``. Normally
that is the peer's own serving thread, which waits for data in an epoll set without holding
the role. A thread here blocked in ``recv()`` on a pipe end whose data comes from that peer
takes the role instead and reads the socket itself (`Peer.lead`), so a message from another
process reaches its reader with no thread in between: the same path the standard library's
socket pipe takes. While a thread leads, the peer's socket is taken out of the serving
thread's epoll set (one-shot), and given back `Timing.hold` after the last read or `Peer.hold`
(so a thread that asks and reads answer after answer pays no system call per answer to
take it out and put it back); a frame that arrives for any other channel is applied by
whoever reads it, and one that nobody here waits for may wait up to about `Timing.hold`.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from fiberexec.multiprocessing import _stream as st
from fiberexec.multiprocessing._links import STREAM, TIMING, Listener, Wire
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
    Signal,
)
from fiberexec.multiprocessing._tally import TallyView

log = logging.getLogger("fiberexec.multiprocessing")
_ONESHOT = getattr(select, "EPOLLONESHOT", 0)
_ARMED = getattr(select, "EPOLLIN", 0) | _ONESHOT


class Wake(Signal):
    """One thread's wake-up descriptor while it leads a peer: set by whoever else makes
    the channel it waits on ready (an item, or end-of-file)."""

    def __init__(self) -> None:
        super().__init__()
        self.owner = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() != self.owner:  # the leader itself needs no wake-up
            self.set(True)

    def __del__(self) -> None:
        self.close()


_wakes = threading.local()


def thread_wake() -> Wake:
    """This thread's `Wake` (closed when the thread ends)."""
    wake: Wake | None = getattr(_wakes, "wake", None)
    if wake is None:
        wake = _wakes.wake = Wake()
    return wake


class Peer:
    """The broker's end of one process's stream; sends are serialised."""

    def __init__(self, conn: Wire, apply: Callable[[Peer, bytes], None]) -> None:
        self.conn = conn
        self.lock = threading.Lock()  # serialises sends
        self.role = threading.Lock()  # held by the one thread reading the socket
        self.apply = apply
        self.holder: str | None = None  # the process token it sent first
        self.inlet = ""  # where writers elsewhere may send its pipes directly (`_route`)
        self.gone = False  # a send to it failed: its process is ending
        self.ended = False  # its stream ended: nobody reads it any more
        self.poller: Any = None
        self.held: float | None = None  # since when the socket is kept from the serving
        # thread (by `hold`, or after a `lead`); None while it watches it or a leader reads
        self.holding_until = 0.0  # the serving thread checks holds until then (see `serve`)
        self.kick = Signal()  # wakes the serving thread to check holds
        self.tally: TallyView | None = None  # what its process took of queues here
        self.slots: dict[int, int] = {}  # queue -> its slot in that page
        if _ONESHOT:
            self.poller = select.epoll(2)
            self.poller.register(conn.fileno(), _ARMED)
            self.poller.register(self.kick.r, select.EPOLLIN)

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

    # ------------------------------------------------------------------ reading

    @property
    def leadable(self) -> bool:
        """Whether a thread here may read this peer's socket itself (see the module)."""
        return self.poller is not None and not self.ended

    def _arm(self, events: int) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed: the stream has ended
            self.poller.modify(self.conn.fileno(), events)

    def _drain(self, first: bool) -> None:
        """Read and apply every whole frame at hand (and, if ``first``, wait for one)."""
        if first:
            self.apply(self, self.conn.recv_bytes())
        while self.conn.frame_ready():
            self.apply(self, self.conn.recv_bytes())

    def serve(self) -> None:
        """The serving thread: read whatever arrives while no other thread leads.

        Returns when the stream ends (EOF, a socket error, or a frame it cannot apply)."""
        if self.poller is None:  # no epoll: this thread is the only reader
            while True:
                self.apply(self, self.conn.recv_bytes())
        while True:
            timeout = TIMING.hold if time.monotonic() < self.holding_until else -1
            readable = False
            for fd, _ in self.poller.poll(timeout):
                if fd == self.kick.r:
                    self.kick.set(False)
                else:
                    readable = True
            held = self.held
            if held is None and not readable:
                continue  # a timeout or a kick: only an expired hold needs this thread
            if held is not None and time.monotonic() - held < TIMING.hold:
                continue  # a thread here reads answers from this peer (see `_keep`)
            if not self.role.acquire(blocking=False):
                continue  # a leader reads; it arms the socket again when it lets go
            self.held = None
            try:
                if self.conn.frame_ready() or self.conn.poll(0):
                    self._drain(first=True)
            finally:
                self.role.release()
                self._arm(_ARMED)

    def lead(self, wake: Wake, timeout: float | None, keep: bool = True) -> None:
        """Read this peer's frames in the calling thread (which holds ``role``) until one
        was applied, ``wake`` is set, or ``timeout`` passes; then let go of the role, and
        unless not ``keep``, keep the socket from the serving thread a little longer."""
        if self.held is None:
            self._arm(_ONESHOT)  # the serving thread stops watching
        self.held = None
        try:
            if self.conn.poll(timeout, wake.r):
                self._drain(first=True)
        except (EOFError, OSError):
            self.conn.shutdown()  # the serving thread sees the end and cleans up
            keep = False
        except Exception:
            log.exception("a stream sent a frame this process could not apply; closing it")
            self.conn.shutdown()
            keep = False
        finally:
            # the socket stays out of the serving thread's set for `HOLD` more: a thread
            # that reads one answer after another (a request loop) then pays no system
            # call to take it out and put it back each time; the serving thread takes it
            # back once nobody has led or held it for that long
            if keep:
                self._keep(time.monotonic())
            self.role.release()
            if not keep:
                self._arm(_ARMED)

    def _keep(self, now: float) -> None:
        """Keep the (disarmed) socket from the serving thread until ``now + Timing.hold``."""
        self.held = now
        waits_forever = now >= self.holding_until
        self.holding_until = now + 100 * TIMING.hold  # set before the kick: the thread reads it
        if waits_forever:  # the serving thread waits without a timeout: wake it
            self.kick.set(True)

    def hold(self) -> None:
        """A thread here is about to send this peer something it answers, then read the
        answer (a duplex pipe end, see `Broker.expect`): take the socket from the serving
        thread now, so that the answer is not read there first and handed over. The
        serving thread takes it back if no thread has come to read within `Timing.hold`."""
        if not self.leadable or self.role.locked():
            return
        now = time.monotonic()
        if self.held is None:
            self._arm(_ONESHOT)
        self._keep(now)

    def unhold(self) -> None:
        """Give a held socket back to the serving thread now (see `hold`)."""
        if self.held is not None:
            self.held = None
            if not self.role.locked():
                self._arm(_ARMED)

    def run(self, lost: Callable[[], None]) -> None:
        """The serving thread's body: `serve` until the stream ends, then ``lost()`` (once
        a leader has finished its frame) and close."""
        try:
            self.serve()
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("a stream sent a frame this process could not apply; closing it")
        finally:
            with self.role:  # a leader finishes its frame first
                self.ended = True
            lost()
            self.close()

    def close(self) -> None:
        self.ended = True
        self.kick.close()
        if self.tally is not None:
            self.tally.close()
        if self.poller is not None:
            with contextlib.suppress(OSError):
                self.poller.close()
        with contextlib.suppress(OSError):
            self.conn.close()


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
        self._serve(Peer(Wire(sock), self._apply))

    def _serve(self, peer: Peer) -> None:
        peer.run(lambda: self.broker.peer_lost(peer, peer.holder))

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
