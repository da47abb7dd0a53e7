"""Connections for direct routes (`_route`): an abstract Unix socket on one host and network
namespace, TCP between hosts.

A reader's inlet address is ``<abstract name>`` or ``<abstract name>|<ip>:<port>``: the
TCP part exists when the process reaches the pipe's creator over a network (not loopback),
and listens on the address it reaches the creator from, so writers that reach the same
creator can usually reach it too. A writer tries the Unix socket first (it is faster, and it
fails at once on another host or namespace), then TCP within a timeout.

Both ways run the HMAC challenge of `multiprocessing.connection` (the broker's secret, both
directions) before anything is read. Over TCP the challenge has `HANDSHAKE_TIMEOUT` to
finish, and runs in a thread of its own on the listening side, so a peer that connects and
says nothing holds only that thread, for that long.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    answer_challenge,
    deliver_challenge,
)
from urllib.parse import urlsplit

log = logging.getLogger("fiberexec.multiprocessing")

CONNECT_TIMEOUT = 3.0  # a reader's host that does not answer by then is relayed to
HANDSHAKE_TIMEOUT = 10.0


def outward_ip(endpoint_address: str) -> str | None:
    """The local IP this process reaches ``endpoint_address`` (``tcp://host:port``) from;
    None when that is loopback (every peer that reaches it is then on this host)."""
    parts = urlsplit(endpoint_address)
    if not parts.hostname or parts.port is None:
        return None
    family = socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect((parts.hostname, parts.port))
            ip = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if ipaddress.ip_address(ip).is_loopback else ip


def _timeouts(conn: Connection, seconds: float) -> None:
    """Bound each read and write on ``conn``'s socket (0: no bound), at the socket level
    (a `Connection` reads its descriptor directly)."""
    sock = socket.socket(fileno=conn.fileno())
    try:
        value = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    finally:
        sock.detach()


def dial(address: str, secret: bytes) -> Connection:
    """An authenticated connection to the inlet at ``address`` (see the module).

    Raises:
        OSError, EOFError, AuthenticationError: no way in.
    """
    unix, _, tcp = address.partition("|")
    try:
        return Client(unix, family="AF_UNIX", authkey=secret)
    except OSError:
        if not tcp:
            raise
    host, _, port = tcp.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Connection(sock.detach())
    try:
        _timeouts(conn, HANDSHAKE_TIMEOUT)
        answer_challenge(conn, secret)
        deliver_challenge(conn, secret)
        _timeouts(conn, 0)
    except BaseException:
        conn.close()
        raise
    return conn


class TcpListener:
    """The TCP side of an inlet: accepts, authenticates each connection in a thread of its
    own, and hands the authenticated ones to ``admit``."""

    def __init__(self, ip: str, secret: bytes, admit: Callable[[Connection], None]) -> None:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((ip, 0))
        self.sock.listen(64)
        port = self.sock.getsockname()[1]
        self.address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        self.secret = secret
        self.admit = admit
        threading.Thread(target=self._accept, daemon=True, name="fiberexec-mp-route").start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._authenticate, args=(sock,), daemon=True,
                             name="fiberexec-mp-route").start()

    def _authenticate(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock.detach())
        try:
            _timeouts(conn, HANDSHAKE_TIMEOUT)
            deliver_challenge(conn, self.secret)
            answer_challenge(conn, self.secret)
            _timeouts(conn, 0)
        except (AuthenticationError, EOFError, OSError) as exc:
            log.warning("rejected a pipe connection over TCP: %s", exc or type(exc).__name__)
            conn.close()
            return
        self.admit(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
