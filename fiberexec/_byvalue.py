"""When a function pickled by value can be sent again as the same bytes.

A function that cannot be pickled by reference (a lambda, a closure, anything defined in
``__main__``) is pickled by value, with what it reads: the globals its code names, its
closure's cells, its defaults, annotations and attributes. Pickling it again for every batch
of tasks costs the executor 30-110 us a time; the bytes change only if one of those changes.

So the bytes are kept with a `Recipe` of what they were made from, and reused while each of
those is still the very same object, provided each is immutable (``None``, numbers, strings,
bytes, ranges, tuples and frozensets of such), pickled by reference (a module from
``sys.modules``, an importable class or function: its bytes are its name), or a function that
qualifies in turn; and no module was imported since (the pickle names the submodules loaded
when it was made). A value that can change in place (a list, a dict, an array, an instance)
makes the function pickled every time, as before, so a task always sees what the function
would read at the moment it is sent. The identities are checked against the objects
themselves, which the recipe holds, so an id cannot be reused by another object meanwhile.
"""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_MISSING = object()
_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, range,
                    type(Ellipsis), type(NotImplemented)})
_ATTRIBUTES = ("__code__", "__defaults__", "__kwdefaults__", "__closure__", "__name__",
               "__qualname__", "__module__", "__doc__", "__annotations__", "__dict__",
               "__globals__")
_DEPTH = 8  # how deep a tuple of tuples, or a function calling functions, is looked into
_WIDTH = 64  # how many items of a tuple or frozenset are looked at (more: pickled each time)
MAX = 256  # functions remembered; then the memory starts again

Attr = tuple[Any, str, Any]  # an object, an attribute, the value it had
Named = tuple[dict[str, Any], str, Any]  # a namespace (globals, a dict attribute), a key, value


class Recipe:
    """A by-value pickle (``data``) and what it was made from (see the module)."""

    __slots__ = ("attrs", "cells", "data", "modules", "names", "sizes")

    def __init__(self, data: Any, attrs: list[Attr], names: list[Named],
                 cells: list[tuple[Any, Any]], sizes: list[tuple[dict[str, Any], int]]) -> None:
        self.data = data
        self.attrs = tuple(attrs)
        self.names = tuple(names)
        self.cells = tuple(cells)
        self.sizes = tuple(sizes)  # a dict read whole (annotations, attributes): its length
        self.modules = len(sys.modules)

    def fresh(self) -> bool:
        """Whether pickling the function now would give ``data`` again."""
        if len(sys.modules) != self.modules:
            return False
        for obj, attr, value in self.attrs:
            if getattr(obj, attr, _MISSING) is not value:
                return False
        for space, key, value in self.names:
            if space.get(key, _MISSING) is not value:
                return False
        for cell, value in self.cells:
            if _contents(cell) is not value:
                return False
        return all(len(space) == size for space, size in self.sizes)


# None: seen once, not worth a recipe yet; False: reads something that can change in place,
# so pickled every time
_recipes: dict[Any, Recipe | bool | None] = {}


def known(fn: Any) -> bool:
    """Whether ``fn`` was pickled by value here before."""
    return fn in _recipes


def pickled_each_time(fn: Any) -> bool:
    """Whether ``fn`` reads something that can change in place, so it is pickled again for
    every batch of tasks."""
    return _recipes.get(fn) is False


def changeable_globals(fn: types.FunctionType) -> list[tuple[str, Any]]:
    """The globals ``fn``'s code names that hold data (not a module, class or function)."""
    space = fn.__globals__
    return [(name, space[name]) for name in sorted(code_names(fn.__code__))
            if name in space and not isinstance(space[name], types.ModuleType | type)
            and not callable(space[name]) and type(space[name]) not in _ATOMS]


def dumps(fn: types.FunctionType, pickle_value: Callable[[], T],
          keepable: Callable[[T], bool]) -> T:
    """``fn`` pickled by value: what was kept if still fresh, else ``pickle_value()``,
    kept for next time (if ``keepable``) once ``fn`` is seen again and everything it reads
    qualifies."""
    recipe = _recipes.get(fn, _MISSING)
    if isinstance(recipe, Recipe) and recipe.fresh():
        return recipe.data  # type: ignore[no-any-return]
    if recipe is _MISSING or recipe is False:  # a one-off lambda costs no recipe
        if len(_recipes) >= MAX:
            _recipes.clear()
        _recipes.setdefault(fn, None)
        return pickle_value()
    made = _recipe(fn)  # before pickling: a change after this shows as not fresh
    value = pickle_value()
    _recipes[fn] = Recipe(value, *made) if made is not None and keepable(value) else False
    return value


def _recipe(fn: types.FunctionType) -> tuple[list[Attr], list[Named], list[tuple[Any, Any]],
                                              list[tuple[dict[str, Any], int]]] | None:
    """What pickling ``fn`` by value reads, or None if some of it can change in place."""
    attrs: list[Attr] = []
    names: list[Named] = []
    cells: list[tuple[Any, Any]] = []
    sizes: list[tuple[dict[str, Any], int]] = []
    seen: set[int] = set()

    def stable(value: Any, depth: int) -> bool:
        kind = type(value)
        if kind in _ATOMS:
            return True
        if depth >= _DEPTH:
            return False
        if kind is tuple or kind is frozenset:
            return len(value) <= _WIDTH and all(stable(item, depth + 1) for item in value)
        if kind is types.ModuleType:
            return sys.modules.get(value.__name__) is value
        if kind is types.BuiltinFunctionType:
            owner = value.__self__  # a method of some object is pickled with that object
            return owner is None or type(owner) is types.ModuleType
        if kind is types.FunctionType or isinstance(value, type):
            return _by_reference(value) or (kind is types.FunctionType and gather(value, depth))
        return False

    def gather(func: types.FunctionType, depth: int) -> bool:
        if id(func) in seen:  # (recursion, or two helpers calling each other)
            return True
        seen.add(id(func))
        attrs.extend((func, attr, getattr(func, attr)) for attr in _ATTRIBUTES)
        for space in (func.__annotations__, func.__dict__, func.__kwdefaults__ or {}):
            sizes.append((space, len(space)))
            for key, value in space.items():
                names.append((space, key, value))
                if not stable(value, depth + 1):
                    return False
        if not stable(func.__defaults__, depth + 1):
            return False
        space = func.__globals__
        for name in code_names(func.__code__):
            value = space.get(name, _MISSING)
            names.append((space, name, value))
            if value is not _MISSING and not stable(value, depth + 1):
                return False
        for cell in func.__closure__ or ():
            value = _contents(cell)
            cells.append((cell, value))
            if value is not _MISSING and not stable(value, depth + 1):
                return False
        return True

    return (attrs, names, cells, sizes) if gather(fn, 0) else None


def _by_reference(obj: Any) -> bool:
    """Whether ``obj`` (a function or class) pickles as its name only."""
    try:
        return b"__main__" not in pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False


def code_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it may read (a superset: every
    name it uses as a global or an attribute)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a name not bound yet)
        return _MISSING
