"""The link seam: how frames travel between the executor and one worker.

Three implementations sit under it, and nothing above it knows which one a worker uses::

    shard (executor side)                                    worker
    Endpoint --+-- UnixListener / StreamPipe (_link_stream) <-- StreamLink "unix"  same host
               |                                                                  and netns
               +-- TcpListener / StreamPipe  (_link_stream) <-- StreamLink "tcp"   anywhere
               '-- Channel, pynng Pair1      (_link_nng)    <-- NngLink "nng"      with TLS

The executor opens an `Endpoint` per worker before starting it: a local listener (an abstract
Unix socket) and, for a backend whose workers may run elsewhere, a network one (a TCP port
of its own, or with TLS a pynng Pair1 socket), all behind one file descriptor the shard
selects on. The worker decides when it connects (`connect`): the local link if it can reach
it, else the network at once, with no configuration. The shard `bind`s the endpoint to the
peer that said hello (sends go there), and `seal`s it once that peer has authenticated: the
other ways in close, so an authenticated worker holds exactly one connection.

Contract of both sides, checked by ``tests/test_links.py`` on every implementation and on the
in-memory fake of ``tests/support/links.py``:

* frames arrive whole, in order, and each received frame names its peer (``.pipe.id``);
* the executor's sends never block: what the peer has not read yet waits in a queue, and a
  peer that stops reading for good makes ``send_nowait`` raise `ProtocolError`;
* a peer that hangs up is reported once (``on_remove(pipe)``); a worker's ``recv`` raises
  `LinkClosed` when the executor hangs up;
* ``fileno()`` is readable while a frame waits (or a queued send can make progress).
"""

from __future__ import annotations

import select
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from fiberexec._errors import LinkClosed, ProtocolError
from fiberexec._link_stream import (
    StreamLink,
    StreamPipe,
    TcpListener,
    UnixListener,
    cpu_seconds,
)
from fiberexec._record import Record

if TYPE_CHECKING:  # pynng loads only where a worker dials across hosts (tens of ms)
    from fiberexec._link_nng import Channel, NngLink

__all__ = ["Endpoint", "LinkClosed", "Received", "WorkerLink", "connect"]

PipeCallback = Callable[[Any], None]
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT


class WorkerLink(Protocol):
    """The worker's end of its link."""

    kind: str

    @property
    def closed(self) -> bool: ...

    def recv(self, timeout: float) -> bytes | None:
        """The next frame, or None after ``timeout``; `LinkClosed` once the executor hung up."""

    def try_recv(self) -> bytes | None: ...

    def buffered(self) -> bytes | None:
        """A frame already taken in by this process (no system call), or None."""

    def send(self, frame: bytes, timeout: float) -> None:
        """Send a whole frame, waiting at most ``timeout`` for room; `LinkClosed` on failure."""

    def fileno(self) -> int:
        """A descriptor that polls readable when a frame (or the hang-up) may be read."""

    def close(self) -> None: ...


class Received(Record):
    __slots__ = ("bytes", "pipe")

    def __init__(self, data: bytes, pipe: Any) -> None:
        self.bytes = data
        self.pipe = pipe  # ``.id`` names the peer, ``.close()`` hangs up on it


class Endpoint:
    """The executor's end of one worker's link: a local listener, and a network one (a TCP
    listener, or an nng channel) unless every worker of the backend shares this host.

    Used only by the shard thread that adopted it (`close` may come from the thread that
    made it, before the shard ever sees it).
    """

    def __init__(self, local_name: str, network: Channel | TcpListener | None, *,
                 on_remove: PipeCallback, max_frame: int) -> None:
        self.local_name = local_name
        # None: every worker of this backend reaches the local socket
        self.channel = None if isinstance(network, TcpListener) else network
        self.tcp = network if isinstance(network, TcpListener) else None
        self.address = "" if network is None else network.address
        self.max_frame = max_frame
        self._on_remove = on_remove
        self._poll = select.epoll()
        self.listener: UnixListener | None = None
        try:
            self.listener = UnixListener(local_name)
        except BaseException:
            self._poll.close()
            raise
        self._poll.register(self.listener.fd, _IN)
        if network is not None:
            self._poll.register(network.fileno(), _IN)
        self.pipes: dict[int, StreamPipe] = {}  # fd -> accepted peer (Unix or TCP)
        self.bound: StreamPipe | None = None  # sends go to this peer, else the channel
        self.sealed: StreamPipe | None = None  # authenticated stream peer: the only one left
        self.sealed_nng = False  # the authenticated peer came over the nng channel
        self._ready: deque[Received] = deque()
        self.closed = False

    @property
    def kind(self) -> str:
        """The link sends go over: "unix" or "tcp" once a peer on a stream socket said hello,
        "nng" once a peer on the channel authenticated, "" before either."""
        if self.bound is not None:
            return self.bound.kind
        return "nng" if self.sealed_nng else ""

    def fileno(self) -> int:
        return self._poll.fileno()

    # ------------------------------------------------------------ receiving

    def try_recv(self) -> Received | None:
        """The next frame from any peer, or None when none is waiting."""
        if self._ready:
            return self._ready.popleft()
        if self.sealed_nng and self.channel is not None:  # one authenticated network peer
            while (msg := self.channel.try_recv()) is not None:
                self._ready.append(Received(msg.bytes, msg.pipe))
            return self._ready.popleft() if self._ready else None
        pipe = self.sealed
        if pipe is not None:  # the fast path: one authenticated local peer
            if pipe.queue:
                self._flush(pipe)
            if pipe.drained:  # emptied by the last read: the selector says when more comes
                pipe.drained = False
                return None
            self._read(pipe)
        else:
            for fd, events in self._poll.poll(0):
                self._on_event(fd, events)
        return self._ready.popleft() if self._ready else None

    def take_in(self) -> None:
        """The next `try_recv` reads the socket whatever the selector said (a send found
        the peer gone: what it sent before it went comes first)."""
        if self.sealed is not None:
            self.sealed.drained = False

    def peer_cpu(self) -> float | None:
        """CPU seconds the peer process has used, where the link can tell (a local socket:
        the kernel names the process at its end); None elsewhere."""
        pipe = self.sealed
        return None if pipe is None or not pipe.peer_pid else cpu_seconds(pipe.peer_pid)

    @property
    def peer_gone(self) -> bool:
        """The local peer this endpoint sent to has hung up (its pipe was dropped)."""
        return not self.sealed_nng and self.bound is None and self.sealed is None

    def _on_event(self, fd: int, events: int) -> None:
        if self.listener is not None and fd == self.listener.fd:
            self._accept(self.listener)
        elif self.tcp is not None and fd == self.tcp.fd:
            self._accept(self.tcp)
        elif (pipe := self.pipes.get(fd)) is not None:
            if events & _OUT:
                self._flush(pipe)
            self._read(pipe)
        elif self.channel is not None:
            while (msg := self.channel.try_recv()) is not None:
                self._ready.append(Received(msg.bytes, msg.pipe))

    def _accept(self, listener: UnixListener | TcpListener) -> None:
        while (sock := listener.accept()) is not None:
            pipe = StreamPipe(sock, self.max_frame, self._drop)
            self.pipes[pipe.fd] = pipe
            self._poll.register(pipe.fd, _IN)

    def _read(self, pipe: StreamPipe) -> None:
        try:
            frames = pipe.read()
        except ProtocolError:
            frames = None  # an oversized frame: drop the peer, as nng does
        if frames is None:
            self._drop(pipe)
            return
        self._ready.extend(Received(frame, pipe) for frame in frames)

    def _drop(self, pipe: StreamPipe) -> None:
        if pipe.closed:
            return
        self.pipes.pop(pipe.fd, None)
        if not self.closed:
            self._poll.unregister(pipe.fd)
        pipe.shut()
        if self.bound is pipe:
            self.bound = None
        if self.sealed is pipe:
            self.sealed = None
        self._on_remove(pipe)

    # ------------------------------------------------------------ sending

    def bind(self, pipe: Any) -> None:
        """Send to ``pipe`` from now on (the peer that said hello)."""
        self.bound = pipe if isinstance(pipe, StreamPipe) else None

    def seal(self) -> None:
        """The bound peer authenticated: close every other way in."""
        for listener in (self.listener, self.tcp):
            if listener is not None:
                self._poll.unregister(listener.fd)
                listener.close()
        self.listener = self.tcp = None
        for pipe in [p for p in self.pipes.values() if p is not self.bound]:
            self._drop(pipe)
        if self.bound is not None and self.channel is not None:
            self._poll.unregister(self.channel.fileno())
            self.channel.close()
            self.channel = None
        self.sealed = self.bound
        self.sealed_nng = self.bound is None

    def send_nowait(self, frame: bytes) -> None:
        """Queue ``frame`` for the bound peer; `ProtocolError` if it has stopped reading."""
        pipe = self.bound
        if pipe is None:
            if self.channel is None:
                raise ProtocolError("the worker's connection is closed")
            self.channel.send_nowait(frame)
        elif pipe.send_nowait(frame):
            self._poll.modify(pipe.fd, _IN | _OUT)

    def _flush(self, pipe: StreamPipe) -> None:
        if not pipe.flush() and not pipe.closed:
            self._poll.modify(pipe.fd, _IN)

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pipe in list(self.pipes.values()):
            pipe.shut()
        self.pipes.clear()
        # Nothing of a peer is kept: a record of the worker outlives the link (workers()),
        # and its pipe's read buffer is as large as the largest message it sent.
        self.bound = self.sealed = None
        self._ready.clear()
        for listener in (self.listener, self.tcp):
            if listener is not None:
                listener.close()
        if self.channel is not None:
            self.channel.close()
        self._poll.close()


def connect(local_name: str, address: str, *, max_frame: int, on_remove: PipeCallback,
            tls: Any = None, timeout: float = 60.0) -> WorkerLink:
    """The worker's side: the local link if the executor's socket is reachable, else the
    network (`dial`).

    Raises:
        LinkClosed: the local socket cannot be reached and there is no network address, or
            the network cannot be reached within ``timeout``.
    """
    if local_name:
        link = StreamLink.connect(local_name, max_frame)
        if link is not None:
            return link
    if not address:
        raise LinkClosed(f"cannot reach the executor's local socket {local_name!r}: the "
                         "executor has shut down or exited, or gave up waiting for this "
                         "worker's start (if it still waits, this worker is not on its host, "
                         "in its network namespace, as its user, which a backend that offers "
                         "no network address needs)")
    return dial(address, max_frame=max_frame, on_remove=on_remove, tls=tls, timeout=timeout)


def dial(address: str, *, max_frame: int, on_remove: PipeCallback, tls: Any = None,
         timeout: float = 60.0) -> StreamLink | NngLink:
    """The network link only (a worker whose local connection was refused): a TCP stream
    for a ``tcp://`` address, which it dials again while refused for up to ``timeout``
    seconds; nng for ``tls+tcp://`` (it dials in the background, the handshake waits)."""
    if address.startswith("tcp://"):
        return StreamLink.dial(address, max_frame, timeout)
    from fiberexec._link_nng import Channel, NngLink

    return NngLink(Channel.dial(address, max_message=max_frame, on_remove=on_remove, tls=tls))
