"""ctypes ``Structure`` and ``Union`` classes sent by value (defined in the main script).

A class the workers cannot import (the script's, or one made in a function) travels by
value, with cloudpickle, but a ctypes structure's class holds its fields as ``CField``
descriptors, which do not pickle: ``Value(Point, ...)`` of a script's ``Point`` could not
reach a child. Such a class travels as what makes it (its name, bases, ``_fields_``,
``_pack_``, ``_anonymous_`` and its other attributes, methods included) and is made again
where it arrives, once per process: every later copy is the same class, so ``isinstance``
holds across messages. In the process that defined it, it is the original class.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

_MADE: dict[tuple[str, str, tuple[str, ...]], type] = {}  # (module, qualname, field names)
_LOCK = threading.Lock()
_LAYOUT = ("_fields_", "_pack_", "_anonymous_")
_NOT_CARRIED = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", *_LAYOUT})


def wanted(obj: object) -> bool:
    """Whether ``obj`` is a structure or union class that cannot be imported where it goes."""
    return (isinstance(obj, type) and issubclass(obj, (ctypes.Structure, ctypes.Union))
            and obj not in (ctypes.Structure, ctypes.Union) and not _importable(obj))


def _importable(cls: type) -> bool:
    if cls.__module__ in ("__main__", "__mp_main__") or "<locals>" in cls.__qualname__:
        return False
    return _lookup(cls.__module__, cls.__qualname__) is cls


def _lookup(module: str, qualname: str) -> Any:
    """What ``module.qualname`` names in this process, or None."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def reduce(cls: type) -> tuple[Any, ...]:
    """What `make` needs to make ``cls`` again (its bases and field types reduce in turn)."""
    attributes = {name: value for name, value in vars(cls).items()
                  if name not in _NOT_CARRIED and type(value).__name__ != "CField"}
    layout = {name: vars(cls)[name] for name in _LAYOUT if name in vars(cls)}
    return make, (cls.__module__, cls.__qualname__, cls.__bases__, attributes, layout)


def make(module: str, qualname: str, bases: tuple[type, ...], attributes: dict[str, Any],
         layout: dict[str, Any]) -> type:
    """The class `reduce` described: the original where it was defined, else one made once
    in this process."""
    names = tuple(field[0] for field in layout.get("_fields_", ()))
    key = (module, qualname, names)
    with _LOCK:
        made = _MADE.get(key)
        if made is None:
            made = _original(module, qualname, names)
        if made is None:
            namespace = {**attributes, **layout, "__module__": module, "__qualname__": qualname}
            metaclass = type(bases[0])
            made = metaclass(qualname.rsplit(".", 1)[-1], bases, namespace)
        _MADE[key] = made
    return made


def _original(module: str, qualname: str, names: tuple[str, ...]) -> type | None:
    """The class itself, if this process has it (the one that defined it)."""
    found = _lookup(module, qualname)
    if isinstance(found, type) and tuple(f[0] for f in getattr(found, "_fields_", ())) == names:
        return found
    return None
