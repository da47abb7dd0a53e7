"""The frames of the streams (`_stream`, `_hub`) and direct routes (`_route`), typed.

Each kind of frame is a frozen record (`fiberexec._record`); on the wire it is its
one-byte ``TAG``, an 8-byte channel id (a pipe or queue of the broker) and its body
(`Wire.send`). `decode` turns a frame read back into its record, and each role
applies what it receives under one ``match``: a frame a role does not expect ends its
connection as a protocol error.

    process -> broker (its stream)     Put Subscribe Unsubscribe Claim Release Holder
                                       Flush InletAt Want Returned Tally Counted Done
    broker -> process                  Item Eof Items Revoke Flushed Unroute Count
                                       Tallied Feed
    writer -> reader (a direct route)  Hello Item Stopped Synced Tallied
    reader -> writer                   Ack Nack Stop Return Taken Sync Tally

Nothing here is unpickled: items are the bytes their sender pickled.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import ClassVar, TypeAlias

from fiberexec._record import record

HEAD = struct.Struct("!cQ")  # tag, channel id
_AFTER_HEAD = HEAD.size
NONCE = 8  # bytes of a direct route's nonce
_Q = struct.Struct("!Q")
_WANT = struct.Struct("!QQIIQ")  # consumed, received, wanted, window, settle
_RETURNED = struct.Struct("!QII")  # consumed, wanted, kept
_COUNTED = struct.Struct("!QQ")  # the count asked for, items
_TALLY = struct.Struct("!I16s")  # slot, nonce; then the page's path
_LEN = struct.Struct("!I")


class _Frame:
    """What every frame has: its tag, and its body on the wire (none by default)."""

    __slots__ = ()
    TAG: ClassVar[bytes]
    cid: int

    def body(self) -> bytes:
        return b""

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid)  # type: ignore[call-arg, return-value]


def _batch(items: tuple[bytes, ...] | list[bytes]) -> bytes:
    return b"".join(part for item in items for part in (_LEN.pack(len(item)), item))


def _unbatch(body: bytes) -> tuple[bytes, ...]:
    view, at, items = memoryview(body), 0, []
    while at < len(body):
        (size,) = _LEN.unpack_from(view, at)
        at += _LEN.size
        items.append(bytes(view[at:at + size]))
        at += size
    return tuple(items)


@record
class _Carry(_Frame):
    """A frame that carries one item's bytes as they are."""

    cid: int
    data: bytes

    def body(self) -> bytes:
        return self.data

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body)  # type: ignore[return-value]


@record
class _Batch(_Frame):
    """A frame that carries several items, each after its u32 length."""

    cid: int
    items: tuple[bytes, ...]

    def body(self) -> bytes:
        return _batch(self.items)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, _unbatch(body))  # type: ignore[return-value]


# ------------------------------------------------------------ a process to its broker


@record
class Put(_Carry):
    """An item for pipe or queue ``cid``."""

    TAG: ClassVar[bytes] = b"P"


@record
class Subscribe(_Frame):
    """This process reads pipe ``cid``: send its items here."""

    TAG: ClassVar[bytes] = b"S"
    cid: int


@record
class Unsubscribe(_Frame):
    TAG: ClassVar[bytes] = b"U"
    cid: int


@record
class Claim(_Frame):
    """This process unpickled an end of pipe ``cid`` sent with ``ticket``: it holds it."""

    TAG: ClassVar[bytes] = b"C"
    cid: int
    ticket: str

    def body(self) -> bytes:
        return self.ticket.encode()

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body.decode())


@record
class Release(_Frame):
    """This process closed an end of pipe ``cid``."""

    TAG: ClassVar[bytes] = b"R"
    cid: int


@record
class Done(_Frame):
    """A thread of this process called ``task_done()`` on `JoinableQueue` ``cid``, for an
    item it took (`_stream.Stream.task_done`)."""

    TAG: ClassVar[bytes] = b"d"
    cid: int


@record
class Holder(_Frame):
    """The stream's first frame: the process token its ends are held under."""

    TAG: ClassVar[bytes] = b"T"
    token: str
    cid: int = 0

    def body(self) -> bytes:
        return self.token.encode()

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(body.decode())


@record
class Flush(_Frame):
    """A writer sends ``cid`` directly to the reader at ``inlet`` from now on (`_route`)."""

    TAG: ClassVar[bytes] = b"F"
    cid: int
    nonce: bytes
    inlet: str

    def body(self) -> bytes:
        return self.nonce + self.inlet.encode()

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body[:NONCE], body[NONCE:].decode())


@record
class InletAt(_Frame):
    """Where writers elsewhere may send this process's pipes directly (`_route.Inlet`)."""

    TAG: ClassVar[bytes] = b"L"
    address: str
    cid: int = 0

    def body(self) -> bytes:
        return self.address.encode()

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(body.decode())


@record
class Want(_Frame):
    """A queue consumer's state: taken and received in all, threads waiting beyond the
    items at hand, and how many it accepts ahead; ``settle``, when not 0, asks for
    `Settled` with it once this is applied (a get that gave up waits for what was sent to
    it before: see `_stream.Stream.get`)."""

    TAG: ClassVar[bytes] = b"W"
    cid: int
    consumed: int
    received: int
    wanted: int
    window: int
    settle: int = 0

    def body(self) -> bytes:
        return _WANT.pack(self.consumed, self.received, self.wanted, self.window,
                          self.settle)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, *_WANT.unpack(body))


@record
class Returned(_Frame):
    """The answer to `Revoke`: taken in all, threads still waiting, items kept for them."""

    TAG: ClassVar[bytes] = b"N"
    cid: int
    consumed: int
    wanted: int
    kept: int

    def body(self) -> bytes:
        return _RETURNED.pack(self.consumed, self.wanted, self.kept)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, *_RETURNED.unpack(body))


@record
class Tally(_Frame):
    """This process counts what it takes of queue ``cid`` in ``slot`` of the page at
    ``path`` (`_tally`): to its broker, of all the queue's items; to a producer over a
    direct route, of that producer's."""

    TAG: ClassVar[bytes] = b"Y"
    cid: int
    slot: int
    nonce: bytes
    path: str

    def body(self) -> bytes:
        return _TALLY.pack(self.slot, self.nonce) + self.path.encode()

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        slot, nonce = _TALLY.unpack_from(body)
        return cls(cid, slot, nonce, body[_TALLY.size:].decode())


@record
class Counted(_Frame):
    """The answer to `Count`: items producers sent here directly not yet taken."""

    TAG: ClassVar[bytes] = b"m"
    cid: int
    asked: int
    direct: int

    def body(self) -> bytes:
        return _COUNTED.pack(self.asked, self.direct)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, *_COUNTED.unpack(body))


# ------------------------------------------------------------ a broker to a process


@record
class Item(_Carry):
    """An item of pipe ``cid`` (from the broker, or from its writer over a route)."""

    TAG: ClassVar[bytes] = b"I"


@record
class Eof(_Frame):
    """Pipe ``cid`` has no writer left."""

    TAG: ClassVar[bytes] = b"E"
    cid: int


@record
class Items(_Batch):
    """Items of queue ``cid`` for the consumer's waiting threads, then ahead of its gets."""

    TAG: ClassVar[bytes] = b"B"


@record
class Revoke(_Frame):
    """Give back the items of queue ``cid`` you have not taken (answered by `Returned`)."""

    TAG: ClassVar[bytes] = b"V"
    cid: int


@record
class Flushed(_Frame):
    """What a writer relayed before its `Flush` with ``nonce`` is on its way (``ok``), or
    the pipe is no longer read there."""

    TAG: ClassVar[bytes] = b"D"
    cid: int
    ok: bool
    nonce: bytes

    def body(self) -> bytes:
        return (b"1" if self.ok else b"0") + self.nonce

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body[:1] == b"1", body[1:])


@record
class Unroute(_Frame):
    """Stop the writers that send ``cid`` here directly."""

    TAG: ClassVar[bytes] = b"O"
    cid: int


@record
class Count(_Frame):
    """How many items producers sent queue ``cid`` here directly that are not taken?"""

    TAG: ClassVar[bytes] = b"M"
    cid: int
    asked: int

    def body(self) -> bytes:
        return _Q.pack(self.asked)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, _Q.unpack(body)[0])


@record
class Settled(_Frame):
    """The broker applied the `Want` that asked ``settle``: every item it sent for a
    waiting thread before came before this."""

    TAG: ClassVar[bytes] = b"g"
    cid: int
    settle: int

    def body(self) -> bytes:
        return _Q.pack(self.settle)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, _Q.unpack(body)[0])


@record
class Tallied(_Frame):
    """I read your count of queue ``cid``: the broker's answer (report your takes only now
    and then), or a producer's (no `Taken` per item)."""

    TAG: ClassVar[bytes] = b"y"
    cid: int


@record
class Feed(_Frame):
    """You are (``on``) or are no longer queue ``cid``'s only consumer, fed ahead."""

    TAG: ClassVar[bytes] = b"G"
    cid: int
    on: bool

    def body(self) -> bytes:
        return b"1" if self.on else b"0"

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body == b"1")


# ------------------------------------------------------------ a direct route


@record
class Hello(_Frame):
    """A writer asks to send ``cid`` directly; ``nonce`` names the route to the broker."""

    TAG: ClassVar[bytes] = b"H"
    cid: int
    nonce: bytes

    def body(self) -> bytes:
        return self.nonce

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, body)


@record
class Ack(_Frame):
    TAG: ClassVar[bytes] = b"A"
    cid: int


@record
class Nack(_Frame):
    TAG: ClassVar[bytes] = b"K"
    cid: int


@record
class Stop(_Frame):
    """The reader no longer reads ``cid`` here: send through the broker."""

    TAG: ClassVar[bytes] = b"X"
    cid: int


@record
class Stopped(_Frame):
    """The writer's last direct item of ``cid`` came before this."""

    TAG: ClassVar[bytes] = b"s"
    cid: int


@record
class Return(_Batch):
    """The reader sends back what it had not taken of ``cid``."""

    TAG: ClassVar[bytes] = b"Z"


@record
class Taken(_Frame):
    """The consumer took ``taken`` of this producer's direct items of ``cid`` in all."""

    TAG: ClassVar[bytes] = b"t"
    cid: int
    taken: int

    def body(self) -> bytes:
        return _Q.pack(self.taken)

    @classmethod
    def parse(cls, cid: int, body: bytes) -> Frame:
        return cls(cid, _Q.unpack(body)[0])


@record
class Sync(_Frame):
    """Answer `Synced` after your last direct item of ``cid`` (end-of-file waits for it)."""

    TAG: ClassVar[bytes] = b"Q"
    cid: int


@record
class Synced(_Frame):
    TAG: ClassVar[bytes] = b"J"
    cid: int


Frame: TypeAlias = (
    Put | Subscribe | Unsubscribe | Claim | Release | Holder | Flush | InletAt | Want
    | Returned | Tally | Counted | Done | Item | Eof | Items | Revoke | Flushed | Unroute | Count
    | Settled | Tallied | Feed | Hello | Ack | Nack | Stop | Stopped | Return | Taken | Sync
    | Synced)

_KINDS: tuple[type[_Frame], ...] = (
    Put, Subscribe, Unsubscribe, Claim, Release, Holder, Flush, InletAt, Want, Returned,
    Tally, Counted, Done, Item, Eof, Items, Revoke, Flushed, Unroute, Count, Settled, Tallied,
    Feed, Hello, Ack, Nack, Stop, Stopped, Return, Taken, Sync, Synced)
_PARSE: dict[bytes, Callable[[int, bytes], Frame]] = {kind.TAG: kind.parse for kind in _KINDS}
assert len(_PARSE) == len(_KINDS), "two kinds of frame share a tag"


def decode(raw: bytes) -> Frame:
    """The frame ``raw`` (as `Wire.recv_bytes` returns it) carries; ValueError if it is
    not one."""
    try:
        tag, cid = HEAD.unpack_from(raw)
        return _PARSE[tag](cid, raw[_AFTER_HEAD:])
    except KeyError:
        raise ValueError(f"unknown frame tag {raw[:1]!r}") from None
    except (struct.error, UnicodeDecodeError) as exc:
        if len(raw) < HEAD.size:
            raise ValueError(f"a frame of {len(raw)} bytes is shorter than its "
                             f"{HEAD.size}-byte head") from None
        raise ValueError(f"a malformed {raw[:1]!r} frame: {exc}") from exc


def unexpected(role: str, frame: Frame) -> ValueError:
    """The error that ends a connection over which ``role`` got a frame it never gets."""
    return ValueError(f"{role} got a {type(frame).__name__} frame, which it never expects")
