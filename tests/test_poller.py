"""The shard's poller, on real sockets."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fiberexec._poller import Poller

Pair = tuple[socket.socket, socket.socket]


@pytest.fixture
def pairs() -> Iterator[list[Pair]]:
    made = [socket.socketpair() for _ in range(3)]
    yield made
    for a, b in made:
        a.close()
        b.close()


@pytest.fixture
def poller() -> Iterator[Poller[Any]]:
    made: Poller[Any] = Poller()
    yield made
    made.close()


def test_only_readable_descriptors_are_reported_with_their_data(
        pairs: list[Pair], poller: Poller[Any]) -> None:
    for i, (a, _) in enumerate(pairs):
        poller.register(a.fileno(), f"conn{i}" if i else None)
    assert poller.select(0) == []
    pairs[0][1].send(b"x")
    pairs[2][1].send(b"y")
    ready = sorted(poller.select(5), key=repr)
    assert ready == sorted([(None, select.EPOLLIN), ("conn2", select.EPOLLIN)], key=repr)


def test_a_descriptor_taken_off_is_not_reported_and_can_come_back(
        pairs: list[Pair], poller: Poller[Any]) -> None:
    a, b = pairs[0]
    poller.register(a.fileno(), 1)
    b.send(b"x")
    poller.unregister(a.fileno())
    assert poller.select(0) == []
    poller.register(a.fileno(), 2)
    assert poller.select(0) == [(2, select.EPOLLIN)]


def test_registering_twice_or_taking_off_an_unknown_descriptor_is_an_error(
        pairs: list[Pair], poller: Poller[Any]) -> None:
    a, _ = pairs[0]
    poller.register(a.fileno(), 1)
    with pytest.raises(KeyError, match="already registered"):
        poller.register(a.fileno(), 1)
    with pytest.raises(KeyError):
        poller.unregister(pairs[1][0].fileno())


def test_a_closed_descriptor_is_let_go(poller: Poller[Any]) -> None:
    a, b = socket.socketpair()
    try:
        poller.register(a.fileno(), 1)
        fd = a.fileno()
        a.close()
        poller.unregister(fd)  # (the kernel dropped it from the set already)
        assert poller.select(0) == []
    finally:
        b.close()


def test_a_wait_ends_when_a_descriptor_becomes_readable(
        pairs: list[Pair], poller: Poller[Any]) -> None:
    a, b = pairs[0]
    poller.register(a.fileno(), 7)
    threading.Timer(0.05, b.send, (b"x",)).start()
    assert poller.select(None) == [(7, select.EPOLLIN)]


def test_its_own_descriptor_is_readable_when_one_registered_is(
        pairs: list[Pair], poller: Poller[Any]) -> None:
    """(What a waiting thread polls to know the shard's thread is wanted.)"""
    a, b = pairs[0]
    poller.register(a.fileno(), 1)
    outer = select.poll()
    outer.register(poller.fileno(), select.POLLIN)
    assert outer.poll(0) == []
    b.send(b"x")
    assert outer.poll(5000) == [(poller.fileno(), select.POLLIN)]
