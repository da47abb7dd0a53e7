"""The typed frames of the streams and direct routes (`_frames`): what is sent is what is read."""

from __future__ import annotations

import dataclasses
import inspect
import socket
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _frames, _links
from fiberexec.multiprocessing._broker import get_broker
from fiberexec.multiprocessing._frames import HEAD, Frame, decode

KINDS: tuple[type[Any], ...] = tuple(_frames._KINDS)
U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "cid": U64, "consumed": U64, "received": U64, "asked": U64, "direct": U64, "taken": U64,
    "settle": U64,
    "wanted": U32, "window": U32, "kept": U32, "slot": U32,
    "data": st.binary(max_size=300), "items": st.lists(st.binary(max_size=40), max_size=6).map(
        tuple),
    "nonce": st.binary(max_size=24), "token": st.text(), "ticket": st.text(),
    "address": st.text(), "inlet": st.text(), "path": st.text(), "ok": st.booleans(),
    "on": st.booleans(),
}
EXACT = {(_frames.Flush, "nonce"): _frames.NONCE, (_frames.Tally, "nonce"): 16}


def _strategy(kind: type[Any]) -> st.SearchStrategy[Any]:
    fields = {}
    for field in inspect.signature(kind).parameters.values():
        size = EXACT.get((kind, field.name))
        fields[field.name] = (st.binary(min_size=size, max_size=size) if size is not None
                              else FIELDS[field.name])
    if "cid" not in {f.name for f in inspect.signature(kind).parameters.values()
                     if f.default is inspect.Parameter.empty}:
        fields["cid"] = st.just(0)  # sent on no channel
    return st.builds(kind, **fields)


def _raw(frame: Frame) -> bytes:
    """What `Wire.send` puts on the wire after the frame's length."""
    return HEAD.pack(frame.TAG, frame.cid) + frame.body()


@given(st.one_of(*(_strategy(kind) for kind in KINDS)))
def test_every_frame_reads_back_as_it_was_sent(frame: Frame) -> None:
    assert decode(_raw(frame)) == frame


def test_every_kind_has_its_own_tag_and_a_way_back() -> None:
    tags = [kind.TAG for kind in KINDS]
    assert len(set(tags)) == len(tags) == len(_frames._PARSE)
    assert all(len(tag) == 1 for tag in tags)
    assert set(KINDS) == set(Frame.__args__)  # type: ignore[attr-defined]


def test_a_frame_is_frozen() -> None:
    frame = _frames.Put(3, b"x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        frame.cid = 4  # type: ignore[misc]


@pytest.mark.parametrize(("raw", "message"), [
    (b"\x00" * 3, "shorter than its 9-byte head"),
    (HEAD.pack(b"?", 1), r"unknown frame tag b'\?'"),
    (HEAD.pack(b"W", 1) + b"\x00" * 5, "a malformed b'W' frame"),
    (HEAD.pack(b"C", 1) + b"\xff\xfe", "a malformed b'C' frame"),
])
def test_bytes_that_are_no_frame_are_refused_with_what_is_wrong(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(raw)


def test_frames_cross_a_real_connection_in_order() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sent: list[Frame] = [
        _frames.Holder("token-1"), _frames.Put(7, b"a" * 70_000), _frames.Items(7, (b"1", b"")),
        _frames.Want(7, 1, 2, 3, 256), _frames.Flushed(9, True, b"n" * 8), _frames.Eof(7)]
    writer, reader = _links.Wire(left), _links.Wire(right)
    thread = threading.Thread(target=lambda: [writer.send(frame) for frame in sent])
    thread.start()  # a large frame does not fit the socket's buffer: read while it writes
    got = [decode(reader.recv_bytes()) for _ in sent]
    thread.join(10)
    assert got == sent
    left.close()
    right.close()


def test_a_role_refuses_a_frame_it_never_expects() -> None:
    error = _frames.unexpected("a pipe's writer", _frames.Put(1, b"x" * 10_000))
    assert str(error) == "a pipe's writer got a Put frame, which it never expects"


@pytest.mark.parametrize("frame", [
    _frames.Item(1, b"x"),  # a broker sends items; it never gets one
    _frames.Ack(1),  # a route's answer, not a stream's
], ids=["Item", "Ack"])
def test_a_broker_hangs_up_on_a_stream_that_sends_what_a_process_never_sends(
        frame: Frame) -> None:
    broker = get_broker()
    host, port, unix = broker.endpoint.call(calls.OpenStream())[0]
    wire = _links.Wire(_links.dial(broker.secret, unix, (host, port), service=_links.STREAM))
    wire.send(_frames.Holder("a-test"))
    cid = broker.endpoint.call(calls.NewChan(0, -1))[0]  # a queue
    wire.send(_frames.Put(cid, b"item"))  # what a process sends: taken, no answer
    assert not wire.poll(0.3)
    wire.send(frame)
    assert wire.poll(10)  # the broker's answer to it: the end of the connection
    with pytest.raises(EOFError):
        wire.recv_bytes()
    wire.sock.close()
    del broker.channels.chans[cid]
