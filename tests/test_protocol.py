"""The wire protocol: round trips, and arbitrary bytes give only ProtocolError."""

from __future__ import annotations

import math
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiberexec import PicklingError, ProtocolError
from fiberexec import _protocol as p
from fiberexec._record import Record
from fiberexec._serialize import (
    FLAT_MAX,
    SHORT_TEXT,
    Payload,
    dumps,
    dumps_scalar,
    dumps_scalars,
    loads,
)

payloads = st.builds(
    Payload,
    st.binary(max_size=64),
    st.lists(st.binary(max_size=64).map(lambda b: memoryview(bytearray(b))), max_size=3),
)
nonces = st.binary(min_size=16, max_size=16)
proofs = st.binary(min_size=32, max_size=32)
texts = st.text(max_size=20)
ids = st.integers(0, 2**64 - 1)

messages = st.one_of(
    st.builds(p.Hello, texts, nonces, st.integers(0, 2**32 - 1), texts, proofs, texts),
    st.builds(p.Setup, proofs, st.booleans(), st.booleans(), st.floats(0.01, 100),
              st.floats(0.01, 1000), st.integers(0, 2**32 - 1), st.none() | payloads,
              st.sampled_from(p.OutputMode), st.integers(0, 2**64 - 1)),
    payloads.flatmap(
        lambda fn: st.builds(
            p.Tasks,
            st.just([fn]),
            st.lists(st.builds(p.Task, ids, st.just(0), payloads), max_size=4),
            st.booleans(),
        )
    ),
    st.builds(
        p.Results,
        st.lists(st.builds(p.Result, ids, st.sampled_from(p.Status), payloads,
                           st.floats(0, 10)), max_size=4),
    ),
    st.just(p.Heartbeat()),
    st.builds(p.Heartbeat, st.floats(0, 6400), st.integers(0, 2**64 - 1), st.binary(max_size=40),
              st.binary(max_size=40)),
    st.builds(p.DumpStack, st.integers(0, 2**64 - 1)),
    st.builds(p.Stack, st.integers(0, 2**64 - 1), st.text(max_size=200)),
    st.builds(p.Bye, texts),
    st.builds(p.Revoke, st.lists(st.integers(0, 2**64 - 1), max_size=20)),
    st.builds(p.Revoked, st.lists(st.integers(0, 2**64 - 1), max_size=20)),
    st.builds(p.InitFailed, payloads),
    st.just(p.Initialized()),
    st.just(p.Interrupt()),
    st.builds(p.Imported, st.lists(st.tuples(texts, texts), max_size=5)),
)


def _normal(message: p.Message) -> object:
    """Compare payload buffers as bytes, and each record with its type (a `Task` is no
    `Result` with the same fields)."""
    if isinstance(message, Payload):
        return (message.data, [bytes(b) for b in message.buffers])
    if isinstance(message, Record):
        return (type(message), [_normal(value) for value in message.fields()])
    if isinstance(message, list | tuple):
        return (type(message), [_normal(m) for m in message])
    return message


@given(messages)
def test_encode_decode_round_trip(message: p.Message) -> None:
    assert _normal(p.decode(p.encode(message))) == _normal(message)


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes_give_only_protocol_errors(data: bytes) -> None:
    try:
        p.decode(data)
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(messages, st.data())
def test_corrupted_frames_give_only_protocol_errors(
    message: p.Message, data: st.DataObject
) -> None:
    frame = bytearray(p.encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(frame) - 1))
        frame[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    try:
        p.decode(bytes(frame[:cut]))
    except ProtocolError:
        pass


def test_shared_memory_names_from_peers_are_confined() -> None:
    frame = bytearray(p.encode(p.InitFailed(Payload(b"x", [memoryview(b"y" * 10)]))))
    # rewrite the inline buffer as a shared-memory reference to a path outside /dev/shm
    evil = p.encode(p.Bye("../../etc/passwd"))
    assert b"passwd" in evil
    header_and_data = bytes(frame[: 4 + 4 + 4 + 1])  # header, length, count, the byte
    forged = header_and_data + b"\x01" + (10).to_bytes(8, "big") + evil[4:]
    try:
        p.decode(forged, allow_shm=True)
        raise AssertionError("a path outside /dev/shm was accepted")
    except ProtocolError as exc:
        assert "unavailable" in str(exc) or "stray" in str(exc)


scalars = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                    st.complex_numbers(allow_nan=False), st.text(max_size=50),
                    st.binary(max_size=50))


flats = st.one_of(st.lists(scalars, max_size=FLAT_MAX),
                  st.lists(scalars, max_size=FLAT_MAX).map(tuple))
plain_values = st.one_of(scalars, flats, st.sampled_from([abs, math.sqrt, operator.add]))


@given(st.lists(plain_values, max_size=6).map(tuple),
       st.dictionaries(texts, plain_values, max_size=3))
@settings(max_examples=50)
def test_plain_arguments_pickle_at_once_and_round_trip(args: tuple[object, ...],
                                                       kwargs: dict[str, object]) -> None:
    """Numbers, short text, flat lists and tuples of them (a map's chunks) and C modules'
    functions (a chunk's function)."""
    payload = dumps_scalars(args, kwargs)
    assert payload is not None and not payload.buffers
    assert loads(payload) == (args, kwargs)


@given(st.one_of(scalars, flats))
@settings(max_examples=50)
def test_a_plain_result_pickles_at_once_and_round_trips(value: object) -> None:
    payload = dumps_scalar(value)
    assert payload is not None and not payload.buffers
    assert loads(payload) == value and payload.nbytes == len(payload.data)


def _script_function() -> None: ...


_script_function.__module__ = "__main__"


class _Listed(list):  # type: ignore[type-arg]
    pass


# flat, but a pickle long enough to travel apart (`STREAM_APART`)
_LONG = [str(i).rjust(SHORT_TEXT, "y") for i in range(FLAT_MAX)]


@given(st.sampled_from([[[1]], ((2,),), [object()], {"a": 1}, "x" * (SHORT_TEXT + 1),
                        b"y" * (SHORT_TEXT + 1), [b"y" * (SHORT_TEXT + 1)],
                        list(range(FLAT_MAX + 1)), _Listed([1]), _script_function, _LONG,
                        [].append, len.__self__, bytearray(b"z"), True.__class__,
                        object()]))
def test_anything_else_takes_the_full_path(value: object) -> None:
    """Nested or long lists, subclasses, functions pickled by value, bound methods, pickles
    long enough to travel apart: `dumps` looks at those."""
    assert dumps_scalars((1, value), {}) is None
    assert dumps_scalars((), {"k": value}) is None
    assert dumps_scalar(value) is None
    assert dumps((value,), what="arguments") is not None  # (which takes every kind)


def test_a_module_function_its_module_no_longer_names_takes_the_full_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One that cannot be pickled by its names is `dumps`' to refuse, saying why: never an
    error from the quick path."""
    import _operator

    fn = _operator.neg
    assert dumps_scalars((fn, 1), {}) is not None
    monkeypatch.delattr(_operator, "neg")
    assert dumps_scalars((fn, 1), {}) is None
    with pytest.raises(PicklingError, match="cannot pickle the arguments"):
        dumps(((fn, 1), {}), what="arguments")


def test_an_exception_that_refuses_its_traceback_still_goes_back() -> None:
    """A frozen dataclass exception cannot be given ``__traceback__ = None``: the worker
    died pickling it, and the task ran again on two more workers."""
    import dataclasses

    from fiberexec._serialize import dumps_exception, loads_exception

    @dataclasses.dataclass(frozen=True)
    class Refusing(Exception):
        code: int

    from fiberexec._errors import SerializationError

    try:
        raise Refusing(8)
    except Refusing as exc:
        payload = dumps_exception(exc)
    # Its own unpickling refuses too (as the stdlib's): the future says so, by name
    with pytest.raises(SerializationError, match="exception raised by the task: Frozen"):
        loads_exception(payload)
