"""`fiberexec._record`: a record class behaves as the standard library's frozen dataclass
does, built by ``dataclass(frozen=True, slots=True)`` (``record``) or
``dataclass(frozen=True)`` (``record_with_dict``): the same classes, declared once, built
by both, must answer every question alike."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from fiberexec._record import record, record_with_dict

BUILDERS: dict[str, Callable[[type[Any]], type[Any]]] = {
    "dataclass-slots": dataclasses.dataclass(frozen=True, slots=True),
    "record": record,
    "dataclass": dataclasses.dataclass(frozen=True),
    "record_with_dict": record_with_dict,
}


def _kinds(label: str) -> dict[str, type[Any]]:
    """A base with no record of its own, records on it, one with defaults, one empty; each
    kind a global of this module under a name of its own, so that pickle finds it."""
    build = BUILDERS[label]

    class Base:
        __slots__ = ()
        TAG: ClassVar[bytes]
        cid: int  # a plain class's annotation: no field

        def body(self) -> bytes:
            return b""

    class Carry(Base):
        cid: int
        data: bytes

        def body(self) -> bytes:
            return self.data

    class Put(Carry):
        TAG: ClassVar[bytes] = b"P"

    class Want(Base):
        """A consumer's state."""

        TAG: ClassVar[bytes] = b"W"
        cid: int
        wanted: int
        settle: int = 0
        note: str = "none"

    class Ping:
        pass

    carry = build(Carry)

    class PutOn(carry):  # type: ignore[valid-type, misc]
        TAG: ClassVar[bytes] = b"P"

    kinds = {"Carry": carry, "Put": build(PutOn), "Want": build(Want), "Ping": build(Ping)}
    for name, kind in kinds.items():
        kind.__qualname__ = kind.__name__ = f"{name}_{label.replace('-', '_')}"
        globals()[kind.__qualname__] = kind
    return kinds


def _probe(label: str) -> list[Any]:
    """Everything observable about the records ``BUILDERS[label]`` makes."""
    kinds = _kinds(label)
    carry, put, want, ping = kinds["Carry"], kinds["Put"], kinds["Want"], kinds["Ping"]
    answers: list[Any] = []
    for made in (carry(1, b"x"), put(2, data=b"y"), want(3, 4), want(3, 4, settle=5, note="n"),
                 ping()):
        kind = type(made)
        again = kind(*[getattr(made, name) for name in kind.__match_args__])
        answers.append((kind.__match_args__, str(inspect.signature(kind)),
                        repr(made).replace(f"_{label.replace('-', '_')}", ""), made == again,
                        hash(made) == hash(again), hasattr(made, "__dict__"),
                        pickle.loads(pickle.dumps(made)) == made))
        for name in kind.__match_args__:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(made, name, 9)
            with pytest.raises(dataclasses.FrozenInstanceError):
                delattr(made, name)
    answers.append(carry(1, b"x") == put(1, b"x"))  # another kind is never equal
    answers.append(want(1, 2) == (1, 2, 0, "none"))
    answers.append(put(5, b"z").body())
    match want(7, 8):
        case put(cid, data):
            answers.append(("put", cid, data))
        case want(cid, wanted, settle=settle):
            answers.append(("want", cid, wanted, settle))
    answers.append(want.__doc__)
    answers.append((want.TAG, put.TAG, issubclass(put, carry)))
    return answers


@pytest.mark.parametrize(("ours", "stdlib"), [("record", "dataclass-slots"),
                                              ("record_with_dict", "dataclass")])
def test_a_record_answers_as_the_stdlibs_frozen_dataclass(ours: str, stdlib: str) -> None:
    assert _probe(ours) == _probe(stdlib)


@pytest.mark.parametrize("build", [record, record_with_dict])
def test_what_a_record_cannot_take_is_refused_with_the_fix(
        build: Callable[[type[Any]], type[Any]]) -> None:
    class Late:
        first: int = 0
        second: int

    with pytest.raises(TypeError, match="'second' has no default but follows 'first'"):
        build(Late)

    class Factory:
        items: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"not dataclasses.field\(\); use @dataclass"):
        build(Factory)

    class Named:
        other: int

    with pytest.raises(TypeError, match="Named.other: a record's methods use that name"):
        build(Named)


def test_records_with_the_same_fields_share_their_code() -> None:
    fields = {"__annotations__": {"cid": "int", "data": "bytes"}}
    kinds: list[type[Any]] = [record(type(f"K{n}", (), dict(fields))) for n in range(3)]
    codes = {kind.__init__.__code__ for kind in kinds}
    assert len(codes) == 1
    assert [repr(kind(n, b"")) for n, kind in enumerate(kinds)] == [
        "K0(cid=0, data=b'')", "K1(cid=1, data=b'')", "K2(cid=2, data=b'')"]
