"""The network link: one reliable, ordered pynng Pair1 connection per worker, TLS optional.

Workers that cannot reach the executor's local link (other hosts, pods, containers in their
own network namespace) dial this one. Each worker gets its own Pair1 socket on the
executor's side (Pair1's polyamorous mode drops messages when a peer's queue is full, so it
cannot carry tasks). On the executor's side a `fiberexec._link.Endpoint` watches its
``fileno()``; the worker's side is wrapped in `NngLink`, which has the local link's interface.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pynng

from fiberexec._errors import LinkClosed, ProtocolError
from fiberexec._link_stream import in_range

SEND_QUEUE = 1024  # messages; credit keeps far fewer in flight, so a full queue means a hung peer
_LISTENING = threading.Lock()  # one listener made at a time in this process
PipeCallback = Callable[[Any], None]


class Channel:
    """A Pair1 socket with exactly one peer at a time."""

    def __init__(self, socket: pynng.Pair1, address: str) -> None:
        self._socket = socket
        self.address = address
        self._fd = int(socket.recv_fd)
        self.closed = False
        self._timeouts = {"recv_timeout": -2, "send_timeout": -2}  # ms; set only on change

    @classmethod
    def listen(
        cls,
        host: str,
        *,
        max_message: int,
        on_connect: PipeCallback,
        on_remove: PipeCallback,
        tls: Any = None,
        ports: tuple[int, int] | None = None,
        first: int = 0,
    ) -> Channel:
        """Listen on ``host`` (the executor's side); ``tls``: a server config.

        The port is any free one, or the first free one of the inclusive range ``ports``,
        trying from ``first`` onwards (wrapping around).

        Raises:
            ConfigurationError: every port of ``ports`` is taken.
        """
        with _LISTENING:  # pynng once crashed with two threads making listeners at once
            sock = pynng.Pair1(recv_max_size=max_message, send_buffer_size=SEND_QUEUE,
                               recv_buffer_size=SEND_QUEUE)
            if tls is not None:
                sock.tls_config = tls
            sock.add_post_pipe_connect_cb(on_connect)
            sock.add_post_pipe_remove_cb(on_remove)
            bracketed = f"[{host}]" if ":" in host else host
            scheme = "tls+tcp" if tls is not None else "tcp"
            try:
                port = _listen(sock, f"{scheme}://{bracketed}", ports, first)
            except BaseException:
                sock.close()
                raise
        return cls(sock, f"{scheme}://{bracketed}:{port}")

    @classmethod
    def dial(
        cls, address: str, *, max_message: int, on_remove: PipeCallback, tls: Any = None
    ) -> Channel:
        """Dial the executor (the worker's side); connection happens in the background."""
        sock = pynng.Pair1(recv_max_size=max_message, reconnect_time_max=500)
        if tls is not None:
            sock.tls_config = tls
        sock.add_post_pipe_remove_cb(on_remove)
        sock.dial(address, block=False)
        return cls(sock, address)

    def fileno(self) -> int:
        return self._fd

    def try_recv(self) -> pynng.Message | None:
        """The next message, or None when none is waiting."""
        try:
            return self._socket.recv_msg(block=False)
        except pynng.TryAgain:
            return None
        except pynng.Closed:
            return None

    def recv(self, timeout: float) -> pynng.Message | None:
        """The next message, or None after ``timeout`` seconds."""
        self._set_timeout("recv_timeout", timeout)
        try:
            return self._socket.recv_msg()
        except pynng.Timeout:
            return None

    def send_nowait(self, frame: bytes) -> None:
        """Queue ``frame``; raise `ProtocolError` if the peer has stopped reading."""
        try:
            self._socket.send(frame, block=False)
        except pynng.TryAgain:
            raise ProtocolError("peer is not reading: its send queue is full") from None

    def send(self, frame: bytes, timeout: float) -> None:
        self._set_timeout("send_timeout", timeout)
        self._socket.send(frame)

    def _set_timeout(self, option: str, seconds: float) -> None:
        ms = max(1, int(seconds * 1000))
        if self._timeouts[option] != ms:  # a socket option costs a call into nng
            setattr(self._socket, option, ms)
            self._timeouts[option] = ms

    def close(self) -> None:
        self.closed = True
        self._socket.close()


class NngLink:
    """The worker's end of a `Channel`, with the local link's interface (frames as bytes)."""

    kind = "nng"

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def recv(self, timeout: float) -> bytes | None:
        try:
            msg = self.channel.recv(timeout)
        except pynng.Closed:
            raise LinkClosed("the connection to the executor closed") from None
        return None if msg is None else msg.bytes

    def try_recv(self) -> bytes | None:
        msg = self.channel.try_recv()
        return None if msg is None else msg.bytes

    def buffered(self) -> bytes | None:
        """A frame nng has already taken in (its queue is in this process)."""
        return self.try_recv()

    def fileno(self) -> int:
        return self.channel.fileno()

    def send(self, frame: bytes, timeout: float) -> None:
        try:
            self.channel.send(frame, timeout)
        except pynng.Closed:
            raise LinkClosed("the connection to the executor closed") from None

    def close(self) -> None:
        self.channel.close()


def _listen(sock: pynng.Pair1, base: str, ports: tuple[int, int] | None, first: int) -> int:
    def attempt(port: int) -> int | None:
        try:
            listener = sock.listen(f"{base}:{port}")
        except pynng.AddressInUse:
            return None
        return int(str(listener.local_address).rsplit(":", 1)[1]) if port == 0 else port

    return in_range(ports, first, attempt)
