"""The TCP side of direct pipe routes (`_links`): authenticated both ways before anything
is read, and a peer that connects and says nothing holds up no one else."""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection

import pytest

from fiberexec.multiprocessing import _links

SECRET = b"s" * 32


@pytest.fixture
def listener() -> Iterator[tuple[_links.TcpListener, queue.Queue[Connection]]]:
    admitted: queue.Queue[Connection] = queue.Queue()
    tcp = _links.TcpListener("127.0.0.1", SECRET, admitted.put)
    yield tcp, admitted
    tcp.close()
    while not admitted.empty():
        admitted.get().close()


def test_a_writer_with_the_secret_gets_in_and_talks(
        listener: tuple[_links.TcpListener, queue.Queue[Connection]]) -> None:
    tcp, admitted = listener
    conn = _links.dial(f"\0no-such-abstract-socket|{tcp.address}", SECRET)
    inside = admitted.get(timeout=10)
    conn.send_bytes(b"item")
    assert inside.recv_bytes() == b"item"
    conn.close()


def test_a_wrong_secret_is_refused_both_ways(
        listener: tuple[_links.TcpListener, queue.Queue[Connection]]) -> None:
    tcp, admitted = listener
    with pytest.raises(AuthenticationError):
        _links.dial(f"\0none|{tcp.address}", b"x" * 32)
    with pytest.raises(queue.Empty):
        admitted.get(timeout=0.5)


def test_a_silent_peer_does_not_hold_up_the_next(
        listener: tuple[_links.TcpListener, queue.Queue[Connection]]) -> None:
    tcp, admitted = listener
    host, _, port = tcp.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5):  # says nothing
        started = time.monotonic()
        conn = _links.dial(f"\0none|{tcp.address}", SECRET)
        admitted.get(timeout=10)
        assert time.monotonic() - started < _links.HANDSHAKE_TIMEOUT
        conn.close()


def test_the_outward_address_of_a_loopback_peer_is_none() -> None:
    assert _links.outward_ip("tcp://127.0.0.1:9") is None
    assert _links.outward_ip("not an address") is None
