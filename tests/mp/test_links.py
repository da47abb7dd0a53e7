"""The multiprocessing layer's connections (`_links`): one handshake both ways before
anything is read, over the Unix socket and over TCP, and a peer that connects and says
nothing, or says something else, holds up no one else."""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator

import pytest

from fiberexec.multiprocessing import AuthenticationError, _links

SECRET = b"s" * 32
SERVICE = b"T"


@pytest.fixture
def listener() -> Iterator[tuple[_links.Listener, queue.Queue[socket.socket]]]:
    admitted: queue.Queue[socket.socket] = queue.Queue()
    listening = _links.Listener(SECRET, {SERVICE: admitted.put}, what="a test",
                                tcp_host="127.0.0.1")
    yield listening, admitted
    listening.close()
    while not admitted.empty():
        admitted.get().close()


Listening = tuple[_links.Listener, queue.Queue[socket.socket]]


def _hung_up(sock: socket.socket) -> bool:
    """Whether the other side closed ``sock`` (a close with our bytes unread is a reset)
    without a word."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("way", ["unix", "tcp"])
def test_a_peer_with_the_secret_gets_in_and_talks(listener: Listening, way: str) -> None:
    listening, admitted = listener
    tcp = ("127.0.0.1", listening.port)
    unix = listening.unix if way == "unix" else "\0no-such-abstract-socket"
    with _links.dial(SECRET, unix, tcp, service=SERVICE) as sock:
        inside = admitted.get(timeout=10)
        assert inside.family == (socket.AF_UNIX if way == "unix" else socket.AF_INET)
        sock.sendall(b"item")
        assert inside.recv(4) == b"item"
        inside.close()
    assert listening.rejected == 0


def test_a_text_address_names_both_ways_in(listener: Listening) -> None:
    listening, admitted = listener
    address = f"\0none|{listening.tcp_address('127.0.0.1')}"
    assert _links.split_address(address) == ("\0none", ("127.0.0.1", listening.port))
    assert _links.split_address("\0only") == ("\0only", None)
    with _links.dial(SECRET, *_links.split_address(address), service=SERVICE):
        admitted.get(timeout=10).close()
    with pytest.raises(ConnectionRefusedError, match="no TCP address"):
        _links.dial(SECRET, "\0none", service=SERVICE)


def test_a_wrong_secret_is_refused_both_ways(listener: Listening) -> None:
    listening, admitted = listener
    with pytest.raises(AuthenticationError, match="does not hold"):
        _links.dial(b"x" * 32, listening.unix, service=SERVICE)
    with pytest.raises(queue.Empty):
        admitted.get(timeout=0.5)
    # the other way round: a listener that does not hold the dialler's secret
    other = _links.Listener(b"y" * 32, {SERVICE: admitted.put}, what="an impostor")
    try:
        with pytest.raises(AuthenticationError, match="does not hold"):
            _links.dial(SECRET, other.unix, service=SERVICE)
    finally:
        other.close()


@pytest.mark.parametrize("opening", [
    b"R" + b"\x80\x05N." * 4,  # a request, as if authenticated
    b"\xff" * 8,  # a huge length, as if a frame
])
def test_anything_but_a_handshake_is_rejected_unread(listener: Listening,
                                                     opening: bytes) -> None:
    listening, admitted = listener
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(listening.unix)
        sock.sendall(opening + b"\0" * 32)
        assert _hung_up(sock)  # closed, nothing said
    assert listening.rejected == 1
    assert admitted.empty()


def test_a_silent_peer_does_not_hold_up_the_next(listener: Listening) -> None:
    listening, admitted = listener
    with socket.create_connection(("127.0.0.1", listening.port), timeout=5):  # says nothing
        started = time.monotonic()
        with _links.dial(SECRET, "", ("127.0.0.1", listening.port), service=SERVICE):
            admitted.get(timeout=10).close()
        assert time.monotonic() - started < _links.TIMING.handshake


def test_closing_wakes_a_peer_still_in_its_handshake(listener: Listening) -> None:
    listening, _ = listener
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(listening.unix)
        sock.sendall(_links.MAGIC)  # half a hello
        listening.close()  # whether or not its handshake began, the peer hears the end
        assert _hung_up(sock)
    assert listening.rejected == 0  # closing is not a rejection


def test_a_service_is_admitted_only_while_offered(listener: Listening) -> None:
    """One listener serves several parts of a process (a broker's calls and streams):
    each connection names its service in the handshake, and one not offered is refused by
    name, after both sides proved the secret, so nobody learns what is offered without it."""
    listening, admitted = listener
    with pytest.raises(ConnectionRefusedError, match="serves no b'Y' connections"):
        _links.dial(SECRET, listening.unix, service=b"Y")
    assert listening.rejected == 1
    other: queue.Queue[socket.socket] = queue.Queue()
    listening.offer(b"Y", other.put)
    with _links.dial(SECRET, listening.unix, service=b"Y"):
        other.get(timeout=10).close()
    with _links.dial(SECRET, listening.unix, service=SERVICE):
        admitted.get(timeout=10).close()
    assert other.empty()  # each connection went to its own service
    listening.withdraw(b"Y")
    with pytest.raises(ConnectionRefusedError, match="serves no b'Y'"):
        _links.dial(SECRET, listening.unix, service=b"Y")
    with pytest.raises(AuthenticationError, match="does not hold"):  # the secret comes first
        _links.dial(b"x" * 32, listening.unix, service=b"Y")


def test_the_outward_address_of_a_loopback_peer_is_none() -> None:
    assert _links.outward_ip("tcp://127.0.0.1:9") is None
    assert _links.outward_ip("not an address") is None
