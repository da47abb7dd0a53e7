"""Records: the small slotted classes made per task, and the frozen typed messages.

`Record` is a base for the records made per task (payloads, tasks, results, received
frames). A record declares ``__slots__`` and writes its own ``__init__``; this base compares
two records of one class field by field and shows them as ``Name(field=value, ...)``, as a
dataclass would. It replaces `dataclasses` on a worker's path: importing that module (with
`inspect`) costs a new interpreter 8 ms, and a named tuple, the other light choice, costs
a task more (made in 340 ns against 215, a field read in 35 ns against 15).

``@record`` makes of a class what ``@dataclass(frozen=True, slots=True)`` makes of it, for
the classes it is used on (the executor's events, the multiprocessing layer's frames);
``@record_with_dict`` what ``@dataclass(frozen=True)`` makes (its calls, whose instances
pickle in C)::

    fields           the class's annotations but ``ClassVar``s, after its record bases'
    __init__         positional or by keyword, defaults from the class body
    __repr__, __eq__, __hash__, __match_args__
    frozen           assigning or deleting a field raises ``dataclasses.FrozenInstanceError``

Why not the standard library's: on Python 3.11 ``dataclass`` compiles each method it
writes apart (six for a frozen class), about 1 ms a class on a 2-core machine, and those
three modules define 76 such classes: 100 ms of the 230 ms ``import
fiberexec.multiprocessing`` took, paid by every program and by every child process that
imports it. Here one source is compiled a class, and classes with the same fields share
its code (``_CODE``). ``tests/test_record.py`` builds the same classes both ways and
requires the same answers.

Not supported, and refused when the class is made: ``dataclasses.field()``, a field
without a default after one with a default, a field named ``self``, ``other`` or ``_set``.
"""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any, ClassVar, NoReturn, TypeVar, dataclass_transform, get_origin

__all__ = ["Record", "record", "record_with_dict"]


class Record:
    __slots__: tuple[str, ...] = ()
    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # compared by value

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def fields(self) -> tuple[Any, ...]:
        """The values, in the order of ``__slots__``."""
        return tuple(getattr(self, name) for name in self.__slots__)


T = TypeVar("T")
_MISSING = object()
_CODE: dict[str, CodeType] = {}  # the methods' source -> its code, compiled once
_TAKEN = frozenset({"self", "other", "_set"})  # names the methods' source uses


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """The class, frozen, with ``__slots__`` for its fields."""
    return _build(cls, slots=True)


@dataclass_transform(frozen_default=True)
def record_with_dict(cls: type[T]) -> type[T]:
    """The class, frozen, its fields in an instance ``__dict__`` (pickled in C)."""
    return _build(cls, slots=False)


def _build(cls: type[T], slots: bool) -> type[T]:
    inherited: dict[str, tuple[object, Any]] = {}  # name -> (annotation, default)
    for base in reversed(cls.__mro__[1:]):
        inherited.update(base.__dict__.get("__record_fields__", {}))
    own = {name: (kind, cls.__dict__.get(name, _MISSING))
           for name, kind in cls.__dict__.get("__annotations__", {}).items()  # noqa: RUF063
           if not _is_classvar(kind)}
    fields = {**inherited, **own}
    _check(cls, fields)
    defaults = {name: default for name, (_, default) in fields.items() if default is not _MISSING}
    namespace = {"_set": object.__setattr__, **{f"_d_{name}": v for name, v in defaults.items()}}
    exec(_methods(tuple(fields), tuple(name in defaults for name in fields)), namespace)
    # (our own source, made of the class's field names)
    methods = {name: namespace[name] for name in ("__init__", "__repr__", "__eq__", "__hash__")}
    for name, method in methods.items():
        method.__qualname__ = f"{cls.__qualname__}.{name}"
    methods["__init__"].__annotations__ = {
        **{name: kind for name, (kind, _) in fields.items()}, "return": None}
    attributes: dict[str, object] = {
        **methods, "__match_args__": tuple(fields), "__record_fields__": fields,
        "__setattr__": _frozen_setattr, "__delattr__": _frozen_delattr}
    if not slots:
        for name, value in attributes.items():
            type.__setattr__(cls, name, value)
        return cls
    body = {**cls.__dict__, **attributes, "__reduce__": _reduce,
            "__qualname__": cls.__qualname__,
            "__slots__": tuple(name for name in own if name not in inherited)}
    for name in (*own, "__dict__", "__weakref__"):
        body.pop(name, None)  # a default stays in ``__record_fields__``
    made: type[T] = type(cls.__name__, cls.__bases__, body)
    return made


def _reduce(self: Any) -> tuple[type, tuple[Any, ...]]:
    """A slotted record pickles as its class and fields (a frozen one cannot be given its
    slots' state after it is made)."""
    return self.__class__, tuple(getattr(self, name) for name in self.__match_args__)


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):  # under ``from __future__ import annotations``
        return annotation.split("[", 1)[0] in {"ClassVar", "typing.ClassVar"}
    return annotation is ClassVar or get_origin(annotation) is ClassVar


def _check(cls: type, fields: dict[str, tuple[object, Any]]) -> None:
    after_default = None
    for name, (_, default) in fields.items():
        if name in _TAKEN or name.startswith("_d_"):
            raise TypeError(f"{cls.__qualname__}.{name}: a record's methods use that name "
                            f"themselves; rename the field, or use @dataclass for this class")
        if _is_field(default):
            raise TypeError(f"{cls.__qualname__}.{name}: a record takes a plain default, not "
                            f"dataclasses.field(); use @dataclass for this class")
        if default is not _MISSING:
            after_default = name
        elif after_default is not None:
            raise TypeError(f"{cls.__qualname__}: field {name!r} has no default but follows "
                            f"{after_default!r}, which has one; give it a default or move it up")


def _methods(names: tuple[str, ...], defaults: tuple[bool, ...]) -> CodeType:
    params = "".join(f", {name}=_d_{name}" if has else f", {name}"
                     for name, has in zip(names, defaults, strict=True))
    sets = "".join(f"\n    _set(self, {name!r}, {name})" for name in names) or "\n    pass"
    shown = ", ".join(f"{name}={{self.{name}!r}}" for name in names)
    mine = "".join(f"self.{name}, " for name in names)
    theirs = "".join(f"other.{name}, " for name in names)
    source = (
        f"def __init__(self{params}):{sets}\n"
        f"def __repr__(self):\n    return f'{{self.__class__.__qualname__}}({shown})'\n"
        f"def __eq__(self, other):\n"
        f"    if other.__class__ is self.__class__:\n"
        f"        return ({mine}) == ({theirs})\n"
        f"    return NotImplemented\n"
        f"def __hash__(self):\n    return hash(({mine}))\n")
    code = _CODE.get(source)
    if code is None:
        code = _CODE[source] = compile(source, "<fiberexec record>", "exec")
    return code


def _is_field(default: object) -> bool:
    """Whether ``default`` is a ``dataclasses.field()`` (that module is not imported here:
    if no one imported it, there is none)."""
    dataclasses = sys.modules.get("dataclasses")
    return dataclasses is not None and isinstance(default, dataclasses.Field)


def _frozen_setattr(self: object, name: str, value: object) -> NoReturn:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> NoReturn:
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot delete field {name!r}")

