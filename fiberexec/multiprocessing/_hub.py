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

from fiberexec.multiprocessing._frames import Frame, decode
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


class Steps(Protocol):
    """What a hub does with its streams (`_channels.Channels`)."""

    def step(self, peer: Peer, frame: Frame) -> None:
        """Apply one frame of ``peer``'s stream."""

    def lost(self, peer: Peer) -> None:
        """``peer``'s stream closed: release what its process held."""


class Hub:
    """Accepts streams for a broker and hands their frames to its channels, one step each."""

    def __init__(self, steps: Steps, secret: bytes, port: int, advertise: str) -> None:
        """Streams come to this process's listener, as the broker's calls do (on TCP at
        their ``port``); processes of this host (and network namespace) connect to its
        abstract Unix socket: no TCP stack on every message."""
        self.steps = steps
        self.offer = shared(secret, STREAM, self._admit)
        self.address = (advertise, port, self.offer.unix)

    def _admit(self, sock: socket.socket) -> None:
        """Serve an authenticated stream (in the thread that accepted it)."""
        Peer(Wire(sock), self.steps.step, self.steps.lost).run()

    def close(self) -> None:
        self.offer.withdraw()
