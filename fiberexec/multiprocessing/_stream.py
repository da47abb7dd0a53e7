"""Pipe and queue traffic without round trips: one authenticated stream per process pair.

    process C (holds pipe ends or queues of broker B)        B (the creating process)
      Stream ----- multiprocessing.connection, HMAC -----> Hub: a thread per stream
        send(x)       -> b"P" cid data   (no reply)      ->  put into the channel
        first recv    -> b"S" cid        (subscribe)     ->  queued items, then each new
        recv()        <- b"I" cid data / b"E" cid (EOF)  <-  item as it arrives
                         (read by whichever thread waits; it files items for the others)
        unpickle end  -> b"C" cid ticket; close -> b"R" cid

The stream is opened once, through the broker's RPC (``"stream"``), and authenticated with
the broker's secret by `multiprocessing.connection`'s challenge before any frame is read;
frames are a tag, a channel id and raw bytes (nothing here is unpickled). A pipe between
the creating process and another process thus flows over one direct connection between
them, with no round trip per message; a pipe between two other processes is relayed by the
creator. When a stream closes (its process exited or died), the broker releases every pipe
end that process held, so the reader at the other end sees EOF instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections import defaultdict, deque
from multiprocessing import AuthenticationError as _StdAuthError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from fiberexec.multiprocessing._rpc import _TOKEN, Endpoint, _local_servers, client_for

log = logging.getLogger("fiberexec.multiprocessing")
_HEAD = struct.Struct("!cQ")
PUT, SUBSCRIBE, UNSUBSCRIBE, CLAIM, RELEASE, TOKEN = b"P", b"S", b"U", b"C", b"R", b"T"
ITEM, EOF = b"I", b"E"


def _frame(tag: bytes, cid: int, body: bytes = b"") -> bytes:
    return _HEAD.pack(tag, cid) + body


# ---------------------------------------------------------------------------- broker side


class Peer:
    """The broker's end of one process's stream; sends are serialised."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    def send_item(self, cid: int, body: bytes) -> None:
        with self.lock:
            self.conn.send_bytes(_frame(ITEM, cid, body))

    def send_eof(self, cid: int) -> None:
        with self.lock:
            self.conn.send_bytes(_frame(EOF, cid))


class Hub:
    """Accepts streams for a broker and applies their frames to its channels."""

    def __init__(self, broker: Any, host: str, advertise: str) -> None:
        self.broker = broker
        self.listener = Listener((host, 0), family="AF_INET", authkey=broker.secret)
        self.address = (advertise, self.listener.address[1])
        self.rejected = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="fiberexec-mp-hub").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self.listener.accept()  # the HMAC challenge runs here
            except (_StdAuthError, EOFError, ConnectionError) as exc:
                self.rejected += 1
                log.warning("rejected a stream to the broker: %s", exc)
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(Peer(conn),), daemon=True,
                             name="fiberexec-mp-stream").start()

    def _serve(self, peer: Peer) -> None:
        holder: str | None = None
        try:
            while True:
                frame = peer.conn.recv_bytes()
                tag, cid = _HEAD.unpack_from(frame)
                body = frame[_HEAD.size:]
                if tag == TOKEN:
                    holder = body.decode()
                else:
                    self._apply(peer, holder or "", tag, cid, body)
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("a stream sent a frame the broker could not apply; closing it")
        finally:
            self.broker.peer_lost(peer, holder)
            with contextlib.suppress(OSError):
                peer.conn.close()

    def _apply(self, peer: Peer, holder: str, tag: bytes, cid: int, body: bytes) -> None:
        broker = self.broker
        if tag == PUT:
            broker._put(body, cid, 0.0)
        elif tag == SUBSCRIBE:
            broker.subscribe(cid, peer)
        elif tag == UNSUBSCRIBE:
            broker.unsubscribe(cid, peer)
        elif tag == CLAIM:
            broker.claim(cid, body.decode(), holder)
        elif tag == RELEASE:
            broker.unref(cid, holder)
        else:
            raise ValueError(f"unknown stream frame {tag!r}")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()


# ---------------------------------------------------------------------------- client side


class Stream:
    """This process's stream to one broker: sends frames, receives subscribed items."""

    def __init__(self, address: tuple[str, int], endpoint: Endpoint) -> None:
        self.where = endpoint.address
        self.conn = Client(address, family="AF_INET", authkey=endpoint.secret)
        # the broker's RPC connection watches its liveness for us (see `_rpc`): when it is
        # lost, so is this stream, and whoever waits on it wakes
        self.rpc = client_for(endpoint.address, endpoint.secret)
        self.why = f"the process that created this pipe or queue ({self.where}) is gone"
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.inbox: defaultdict[int, deque[bytes]] = defaultdict(deque)
        self.eof: set[int] = set()
        self.subscribed: defaultdict[int, int] = defaultdict(int)
        self.lost = False
        self.reading = False  # a thread is reading the socket for everyone (leader)
        self.send(TOKEN, 0, _TOKEN.encode())
        self.rpc.on_lost(self._abort)

    def _abort(self) -> None:
        """The broker's process is gone: end the stream, waking a thread blocked reading it."""
        self.why = f"{self.why}: {self.rpc.why}"
        with contextlib.suppress(OSError):
            dup = socket.socket(fileno=os.dup(self.conn.fileno()))
            with contextlib.suppress(OSError):
                dup.shutdown(socket.SHUT_RDWR)
            dup.close()
        with self.cond:
            self.lost = True
            self.cond.notify_all()

    def send(self, tag: bytes, cid: int, body: bytes = b"") -> None:
        if self.lost:
            raise BrokenPipeError(self.why)
        try:
            with self.send_lock:
                self.conn.send_bytes(_frame(tag, cid, body))
        except OSError as exc:
            self.lost = True
            raise BrokenPipeError(self.why) from exc

    def _await(self, cid: int, timeout: float | None) -> bool:
        """Wait for an item or EOF of ``cid``. No thread of its own: the first waiter reads
        the socket for all (and files what it reads), the others wait for it to finish;
        so a message costs no thread switch on the way in. Call with ``cond`` held."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready(cid):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if self.reading:
                self.cond.wait(left)
                continue
            self.reading = True
            self.cond.release()
            try:
                with self.rpc.busy():
                    frame = self._read_one(left)
            finally:
                self.cond.acquire()
                self.reading = False
                self.cond.notify_all()
            if frame is not None:
                self._file(frame)
        return True

    def _read_one(self, timeout: float | None) -> bytes | None:
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return None
            return self.conn.recv_bytes()
        except (EOFError, OSError):
            self.lost = True
            return None

    def _file(self, frame: bytes) -> None:
        tag, cid = _HEAD.unpack_from(frame)
        if tag == ITEM:
            self.inbox[cid].append(frame[_HEAD.size:])
        else:
            self.eof.add(cid)

    def subscribe(self, cid: int) -> None:
        with self.cond:
            self.subscribed[cid] += 1
            first = self.subscribed[cid] == 1
        if first:
            self.send(SUBSCRIBE, cid)

    def unsubscribe(self, cid: int) -> None:
        with self.cond:
            self.subscribed[cid] -= 1
            last = self.subscribed[cid] == 0
        if last:
            with contextlib.suppress(ConnectionError):
                self.send(UNSUBSCRIBE, cid)

    def _ready(self, cid: int) -> bool:
        return bool(self.inbox[cid]) or cid in self.eof or self.lost

    def wait(self, cid: int, timeout: float | None) -> bool:
        """Whether an item or end-of-file for ``cid`` is here, waiting up to ``timeout``."""
        with self.cond:
            return self._await(cid, timeout)

    def take(self, cid: int) -> bytes:
        """The next item for ``cid`` (blocking); EOFError at end-of-file."""
        with self.cond:
            self._await(cid, None)
            if self.inbox[cid]:
                return self.inbox[cid].popleft()
            if cid in self.eof:
                raise EOFError
        raise ConnectionError(self.why)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


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
            address = endpoint.call("stream", ())[0]
            stream = _streams[endpoint.address] = Stream(tuple(address), endpoint)
        return stream
