"""``__main__`` in a worker: where the pickles a task makes find the caller's script.

A function or class defined in the caller's main script reaches a worker by value
(cloudpickle), with ``__module__ == "__main__"``. The standard library's pickler, used by the
task's own code (``pickle.dumps``, ``torch.save``, a ``multiprocessing.Pool`` inside the
task), pickles such an object by reference, as ``__main__.<name>``, and checks that this
name gives back the very same object. In a stdlib worker it does: the worker is a fork of the
script (or imports it, under spawn). Here the worker's ``__main__`` was the worker program
itself, so those pickles failed with "attribute lookup Point on __main__ failed".

So a worker's ``__main__`` is a module of its own (`install`), and each function and class of
the caller's main script that a task's function or arguments bring is put there under its
name as it is unpickled (`adopt`), the newest copy winning. A class reached only deep inside
a task's data is found on demand among the classes cloudpickle rebuilt (`find`).

And the script's functions share that module's namespace, as in a stdlib worker (`home`):
cloudpickle gives the functions of each pickle a globals dict of their own, so a global an
initializer (or an earlier task) set was not there for the next task's function to read.
Each script function a task or initializer brings is rebuilt on ``__main__``'s namespace,
and the globals it brings are put there, the caller's values as they are when it is sent,
except where the worker changed a global itself: one that an initializer or a task bound
again (``global MODEL; MODEL = ...``), or changed in place (a small dict or list of plain
values, compared with a copy of what was put there), keeps the worker's value, as in a
stdlib worker, even if the caller's changed too.
"""

from __future__ import annotations

import builtins
import copy
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any

MAIN = "__main__"
BUDGET = 256  # objects one `adopt` of a function looks at (once per function sent)
ARGS_BUDGET = 16  # and of a task's arguments (each task): a few microseconds at most
_CONTAINERS = (list, tuple, set, frozenset)
adopted: dict[str, Any] = {}  # name -> the newest function or class of that name
# name -> the caller's value as last sent, as it was then (a copy), for the values `_kept`
# can copy; a name not here was never sent, or its value cannot be compared (always placed)
_sent: dict[str, tuple[Any]] = {}
_placed: dict[str, Any] = {}  # name -> the caller's value last put in the namespace
_homed: dict[str, Any] = {}  # name -> the caller's function of that name, rebuilt here
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
KEPT_MAX = 64  # items of a container of plain values `_kept` copies; more: not compared


def install(origin: Mapping[str, str] | None = None,
            fallback: Callable[[str], Any] | None = None) -> types.ModuleType:
    """Make ``sys.modules["__main__"]`` a module of the caller's script's names (empty until
    `adopt` fills it); the program that was ``__main__`` stays importable by its own name.
    A name not found is asked of ``fallback`` (which raises `AttributeError`), if given.

    ``origin`` (`fiberexec._syspath.main_origin` of the caller) gives the module the
    script's ``__file__``, where that file exists here, or the ``__spec__`` of the module
    ``python -m`` ran: a stdlib ``spawn`` child of a task then imports the script as
    ``__mp_main__``, as a spawned child of the script itself does."""
    global _installed
    current = sys.modules.get(MAIN)
    spec = getattr(current, "__spec__", None)
    if (current is not None and spec is not None and spec.name != MAIN
            and sys.modules.setdefault(spec.name, current) is current):
        # as an import would: ``import fiberexec.worker`` then reads it off the package
        package, _, name = spec.name.rpartition(".")
        if package in sys.modules:
            setattr(sys.modules[package], name, current)
    module = types.ModuleType(MAIN, "The caller's main script, as far as its tasks bring it.")
    module.__dict__["__builtins__"] = builtins  # as an executed module has (imports ask)
    origin = origin or {}
    if origin.get("name"):
        module.__spec__ = importlib.machinery.ModuleSpec(origin["name"], None)
    elif origin.get("path") and os.path.exists(origin["path"]):
        module.__file__ = origin["path"]

    def lookup(name: str) -> Any:  # PEP 562: asked for what the module does not hold
        found = find(name)
        if found is not None:
            return found
        if fallback is None or name.startswith("__"):
            raise AttributeError(f"module '__main__' has no attribute {name!r}")
        return fallback(name)

    module.__getattr__ = lookup  # type: ignore[method-assign]
    module.__dict__.update(adopted)
    _sent.clear()  # nothing of the caller's values is in the new namespace
    _placed.clear()
    _homed.clear()
    sys.modules[MAIN] = _installed = module
    return module


_installed: types.ModuleType | None = None
# Counts what the caller's values put in the namespace (a `refresh` with nothing put since
# the function's own last look would put nothing: it is skipped)
placings = 0


def find(name: str) -> Any:
    """The caller's ``__main__.<name>`` as far as it has reached this process, else None:
    an adopted function or class, or a class cloudpickle rebuilt here."""
    found = adopted.get(name)
    if found is not None or name.startswith("__"):
        return found
    cloudpickle = sys.modules.get("cloudpickle.cloudpickle")
    tracker = getattr(cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None)
    if tracker is None:
        return None
    for cls in reversed(list(tracker.keys())):  # newest first: the script may have changed
        if getattr(cls, "__module__", None) == MAIN and getattr(cls, "__qualname__", "") == name:
            _put(name, cls)
            return cls
    return None


def current(obj: Any) -> bool:
    """Whether ``obj`` (a function a task runs) is already what its name gives, or has no
    name to give (a lambda, a method): then there is nothing to adopt again."""
    name = getattr(obj, "__qualname__", None)
    return (not isinstance(name, str) or getattr(obj, "__module__", None) != MAIN
            or not _named(name) or adopted.get(name) is obj)


def settle(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...],
                                                                   dict[str, Any]]:
    """A task's arguments, where a function of the script that its function brought too is
    that very object (one pickle each: two copies of ``f``, where the script has one), and
    what else of the script they bring adopted, without taking a name from the function's."""
    if _FUNCTION in map(type, args):
        args = tuple([_same(a) for a in args])
    if kwargs:
        kwargs = {k: _same(v) for k, v in kwargs.items()}
    if not (_known(args) and _known(kwargs.values())):
        adopt((args, kwargs), replace=False, budget=ARGS_BUDGET)
    return args, kwargs


def _known(values: Iterable[Any]) -> bool:
    """Whether nothing in ``values`` can bring a name not adopted yet (the usual task: the
    same classes of the script again): then the walk is skipped."""
    for value in values:
        kind = type(value)
        if kind is _FUNCTION or kind is dict or kind in _CONTAINERS:
            return False
        if kind.__module__ == MAIN and adopted.get(kind.__qualname__) is not kind:
            return False
    return True


_FUNCTION = types.FunctionType


def _same(obj: Any) -> Any:
    if type(obj) is not types.FunctionType or obj.__module__ != MAIN:
        return obj
    known = adopted.get(obj.__qualname__)
    return known if _twin(known, obj) else home(obj)


def _twin(known: Any, obj: Any) -> bool:
    """Whether ``known`` and ``obj`` are copies of one function of the script."""
    return (type(known) is types.FunctionType and known.__code__ == obj.__code__
            and known.__defaults__ == obj.__defaults__)


def adopt(obj: Any, replace: bool = True, budget: int = BUDGET) -> None:
    """Put the caller's main-script functions and classes that ``obj`` holds (itself, the
    globals, closure and defaults of its functions, the items of its containers, the classes
    of its instances) under their names in ``__main__``; at most ``budget`` objects are
    looked at. Without ``replace``, a copy of a function adopted already leaves the name to it.
    Never raises: an object that cannot be looked into (a proxy, say) leaves the names as
    they were, and the task runs as it would have."""
    try:
        _walk(obj, replace, budget)
    except Exception:  # looked into as far as it could be
        pass


def _walk(obj: Any, replace: bool, budget: int) -> None:
    stack, seen = [obj], set()
    while stack and budget:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        budget -= 1
        kind = type(item)
        if kind is types.FunctionType:
            if item.__module__ != MAIN:
                continue  # importable: pickled by reference, its module is the real one
            known = adopted.get(item.__qualname__)
            if known is item or ((not replace or known is _homed.get(item.__qualname__))
                                 and _twin(known, item)):
                continue  # walked when it was adopted (a copy of one on this namespace:
                # reached through the globals the pickle brought, as a dict's value or a
                # closure's, it must not take the name from the one that reads here)
            _put(item.__qualname__, item)
            stack.extend(islice(item.__globals__.values(), budget))
            stack.extend(c.cell_contents for c in item.__closure__ or () if _filled(c))
            stack.extend(item.__defaults__ or ())
        elif isinstance(item, type):
            if item.__module__ == MAIN and adopted.get(item.__qualname__) is not item:
                if not isinstance(_placed.get(item.__qualname__), type):
                    # (the class the caller's globals name keeps it: another of that name
                    # is reached through a method, as a frozen slotted dataclass's
                    # __setattr__ holds the class it was before its slots were added)
                    _put(item.__qualname__, item)
                stack.extend(islice(vars(item).values(), budget))  # methods: what they call
        elif kind in _CONTAINERS:
            stack.extend(islice(item, budget))
        elif kind is dict:
            stack.extend(islice(item.values(), budget))
        elif kind.__module__ == MAIN and adopted.get(kind.__qualname__) is not kind:
            stack.append(kind)  # its class (its attributes are data: not looked into)


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  # an empty cell raises
    except ValueError:
        return False
    return True


def _named(name: str) -> bool:
    return "." not in name and "<" not in name


def _put(name: str, obj: Any) -> None:
    """Names with a dot (methods, nested functions) and ``<lambda>`` have no place at the top
    of a module: the stdlib's pickler cannot find them in a script either."""
    if not _named(name):
        return
    adopted[name] = obj
    if _installed is not None and sys.modules.get(MAIN) is _installed:
        setattr(_installed, name, obj)
        _count_placing()


def home(fn: Any) -> Any:
    """``fn`` (a task's or initializer's function) on this ``__main__``'s namespace, if it is
    a function of the caller's script, with the script's functions and globals it brought
    (see the module's docstring); anything else as it is."""
    main = _installed
    if type(fn) is not types.FunctionType or fn.__module__ != MAIN or main is None:
        return fn
    space, brought = main.__dict__, fn.__globals__
    if brought is space:
        return fn
    rebuilt: dict[int, types.FunctionType] = {}
    for name, value in list(brought.items()):
        if name.startswith("__") and name.endswith("__"):
            continue  # the module's own (__name__, __builtins__): this module has its own
        if type(value) is types.FunctionType and value.__globals__ is brought:
            function = space[name] = _rebuild(value, space, brought, rebuilt)
            _count_placing()
            _sent.pop(name, None)
            _placed.pop(name, None)
            _homed[name] = function
            if _named(function.__qualname__) and function.__name__ == name:
                adopted[name] = function
            continue
        if isinstance(value, type) and value.__module__ == MAIN:
            _rehome_methods(value, space, brought, rebuilt)
        _place(space, name, value)
    new = _rebuild(fn, space, brought, rebuilt)
    if _named(fn.__qualname__) and fn.__name__ == fn.__qualname__:
        _homed[fn.__name__] = new  # (a def at the top of the caller's script)
    return new


def refresh(fn: Any) -> None:
    """``fn`` (a function of the script as unpickled, before `home`) came again, as the same
    bytes: put the globals it brought here again, as `home` did. Another task's function
    may have put other values of those names here since ('b' after 'a'; 'a' again now
    reads 'a'). The script's functions among them were rebuilt here when it first came."""
    main = _installed
    if type(fn) is not types.FunctionType or fn.__module__ != MAIN or main is None:
        return
    space, brought = main.__dict__, fn.__globals__
    if brought is space:
        return
    for name, value in list(brought.items()):
        if (name.startswith("__") and name.endswith("__")) or (
                type(value) is types.FunctionType and value.__globals__ is brought):
            continue
        _place(space, name, value)


def by_reference() -> bool:
    """Whether a pickle made here may name the script's functions and classes as
    ``__main__.<name>`` for the caller to read as its own (the standard library's pickler
    does so, and the plain pickle costs half of cloudpickle's by value): each function and
    class of the script in this namespace under its own name is the one the caller bound to
    that name and sent with a task's function. Not if the worker made or bound one itself,
    nor for one reached only inside a task's data (the caller may bind it to no name):
    then, as a name the pickle gives may be any of those, everything goes by value."""
    main = _installed
    if main is None or sys.modules.get(MAIN) is not main:
        return False
    for name, value in list(main.__dict__.items()):
        kind = type(value)
        if kind is not types.FunctionType and not issubclass(kind, type):
            continue  # data: pickled by value in any case
        if getattr(value, "__module__", None) != MAIN or getattr(
                value, "__qualname__", None) != name:
            continue  # importable; or another name for it, which no pickle gives
        if _placed.get(name) is not value and _homed.get(name) is not value:
            return False
    return True


def _count_placing() -> None:
    global placings
    placings += 1


def _place(space: dict[str, Any], name: str, value: Any) -> None:
    """Put the caller's ``value`` of global ``name`` here, unless the worker changed that
    global itself (see the module's docstring), or it is the value the caller sent before,
    unchanged (what the worker made of it then stays)."""
    kept = _kept(value)
    if name in space:
        current = space[name]
        if name in _placed:
            if current is not _placed[name]:
                return  # bound again here
            then = _sent.get(name)
            if then is not None and _kept(current) != then:
                return  # changed in place here
            if kept is not None and kept == then:
                return  # the caller's is what it sent before
        elif current is not adopted.get(name):
            return  # set here before the caller sent any value of it
    space[name] = value
    _count_placing()
    _placed[name] = value
    if kept is None:
        _sent.pop(name, None)
    else:
        _sent[name] = kept


def _kept(value: Any) -> tuple[Any] | None:
    """A copy of ``value`` that later changes to it do not reach, for plain values and small
    containers of them; None for anything else (compared as changed)."""
    kind = type(value)
    if kind in _PLAIN:
        return (value,)
    if kind in (tuple, frozenset, list, set) and len(value) <= KEPT_MAX and all(
            type(item) in _PLAIN for item in value):
        return (copy.copy(value),)
    if kind is dict and len(value) <= KEPT_MAX and all(
            type(k) in _PLAIN and type(v) in _PLAIN for k, v in value.items()):
        return (dict(value),)
    return None


def _rebuild(fn: types.FunctionType, space: dict[str, Any], brought: dict[str, Any],
             rebuilt: dict[int, types.FunctionType]) -> types.FunctionType:
    """A copy of ``fn`` whose globals are ``space``; a script function it holds in a closure
    cell (a decorator's wrapped function) is rebuilt too."""
    done = rebuilt.get(id(fn))
    if done is not None:
        return done
    new = types.FunctionType(fn.__code__, space, fn.__name__, fn.__defaults__, fn.__closure__)
    rebuilt[id(fn)] = new
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__annotations__ = fn.__annotations__
    new.__dict__.update(fn.__dict__)
    for cell in fn.__closure__ or ():
        if _filled(cell):
            inner = cell.cell_contents
            if type(inner) is types.FunctionType and inner.__globals__ is brought:
                cell.cell_contents = _rebuild(inner, space, brought, rebuilt)
    return new


def _rehome_methods(cls: type, space: dict[str, Any], brought: dict[str, Any],
                    rebuilt: dict[int, types.FunctionType]) -> None:
    """The methods of a script class the pickle rebuilt read ``space`` too."""
    for name, value in list(vars(cls).items()):
        inner = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        if type(inner) is not types.FunctionType or inner.__globals__ is not brought:
            continue
        new = _rebuild(inner, space, brought, rebuilt)
        try:
            setattr(cls, name, type(value)(new) if inner is not value else new)
        except (AttributeError, TypeError):  # a class that refuses: it reads its own copy
            pass
