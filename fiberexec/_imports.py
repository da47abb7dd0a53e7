"""What workers imported that the program's launcher may import too.

A worker forked from the launcher (`fiberexec._launcher`) starts with what the launcher
imported. One whose tasks then import numpy pays for that import, and so does every worker
started after it (an executor made after another, a replacement, a pool that grows), where
a worker the standard library forks from its parent has it. So a worker on the executor's
host tells its executor which modules its tasks imported (`Imported`), and the launcher
imports them before its next fork:

    worker: a task imports numpy --Imported([("numpy", ".../numpy/__init__.py")])--> shard
    shard --learn()--> this module's table --with the next spawn request--> launcher:
        the same file found under that name? import it; every child after that has it

An executor's first task teaches it too, before its workers start (`learn_from`): what a
worker will import to load the task's function, as this process has it (`needed_by`), so
hundreds of workers forked together do not each import numpy.

Only installed modules count: top-level ones whose file lies in the standard library's or a
site-packages folder, never the user's own code (it may change on disk between executors,
and the launcher would keep the old one). A request whose environment differs from the
launcher's by more than fiberexec's own variables (an executor's ``env=``) is forked by a
launcher that learns nothing (`Launcher.spawn`): what a module reads from the environment
as it is imported (numpy's ``OPENBLAS_NUM_THREADS``) is then the worker's, as before.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import sys
import threading
import types
from collections.abc import Iterable, Sequence

from fiberexec._byvalue import code_names

# (sysconfig, site and importlib.util are imported where needed: a worker started afresh
# imports this module, and most never report anything)

MAX_LEARNED = 1000  # modules kept to teach launchers (a program importing more: the first)

Module = tuple[str, str]  # a top-level module's name and the file it was loaded from


@functools.cache
def _roots() -> tuple[str, ...]:
    """The folders installed modules live in, each ending in a separator."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if key in paths}
    with contextlib.suppress(AttributeError):  # (a virtualenv's old site module lacks them)
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots)


def installed(origin: str) -> bool:
    """Whether the file ``origin`` is part of an installed module (not the user's code)."""
    return os.path.realpath(origin).startswith(_roots())


class ImportWatch:
    """In a worker: the installed top-level modules imported since it was made, each once.

    It looks only at the names added to ``sys.modules`` since it last looked: the table
    keeps its order, so they are its last ones. (A freshly forked worker that looked at
    every name would write to the memory page of each, a reference taken: a few hundred
    pages copied, about 0.3 ms of its start.) If a module was removed meanwhile (the newest
    name of the last look is not where it would be), every name is looked at instead:
    some already there when the watch began may then be reported too, which costs the
    launcher nothing (it has them)."""

    def __init__(self) -> None:
        self.count = len(sys.modules)  # a cheap look first: did the table change at all?
        self._last = next(reversed(sys.modules), "")  # the newest name at the last look
        self._known: set[str] = set()

    def new(self) -> list[Module]:
        added, self.count = len(sys.modules) - self.count, len(sys.modules)
        # (each list made in one step in C: another thread's import cannot change the
        # table midway)
        recent = list(itertools.islice(reversed(sys.modules), max(added, 0) + 1))
        if self._last in recent:
            names = recent[:recent.index(self._last)]
        else:  # a module was removed since (or more were imported as this looked)
            names = list(reversed(sys.modules))
        self._last = names[0] if names else self._last
        found = []
        for name in names:
            if "." in name or name in self._known:
                continue
            self._known.add(name)
            origin = getattr(sys.modules.get(name), "__file__", None)
            if isinstance(origin, str) and installed(origin):
                found.append((name, origin))
        return found


# ---------------------------------------------------------------------------- the program's table

_learned: dict[str, str] = {}  # name -> origin, in the order workers reported them
_lock = threading.Lock()


def learn(modules: Iterable[Module]) -> None:
    """Note modules a worker on this host imported (see the module's docstring)."""
    with _lock:
        for name, origin in modules:
            if len(_learned) < MAX_LEARNED and installed(origin):
                _learned.setdefault(name, origin)


def learned_since(taught: set[str]) -> list[Module]:
    """The modules learned that are not in ``taught`` (which gains them); first, those of
    the names `learn_from` noted that are installed."""
    while _noted:
        try:
            tops = _noted.popleft()
        except IndexError:  # (another launcher's thread took the last)
            break
        learn(_installed_of(tops))
    with _lock:
        new = [(name, origin) for name, origin in _learned.items() if name not in taught]
    taught.update(name for name, _ in new)
    return new


_noted: collections.deque[set[str]] = collections.deque(maxlen=16)  # see `learn_from`
_read: set[tuple[str, str]] = set()  # functions read for what they need, by module and name


def learn_from(fn: object) -> None:
    """Note the top-level modules a worker imports to load ``fn``, a task's function
    (`needed_by`); the launcher's next fork request learns those that are installed (the
    first look at where installed modules live costs a ms or two: not on the thread that
    submits). Names only are kept, not ``fn``: the caller lets go of what it runs, as the
    stdlib does. Once per function; a hint only: from one it cannot read, nothing."""
    try:
        key = (str(getattr(fn, "__module__", "")), str(getattr(fn, "__qualname__", "")))
        if key[1] and key in _read:
            return
        _read.add(key)
        _noted.append(_tops_needed(fn))
    except Exception:  # (an object whose attributes raise: nothing is learned from it)
        return


def needed_by(fn: object) -> list[Module]:
    """The installed top-level modules a worker imports to load ``fn`` from its pickle,
    as this process has them: a program's first task can teach its launcher before any
    worker has run one (a pool of hundreds, forked together, would each import them).

    By reference (defined in a module a worker imports by name), the package of that module
    and those its globals come from, which importing it imports; by value (defined in the
    script, or in a function), those its code names. A callable object counts as its class.
    Only installed ones are returned (`installed`), never the program's own."""
    return _installed_of(_tops_needed(fn))


def _tops_needed(fn: object) -> set[str]:
    """The top-level names of the modules ``fn`` needs (see `needed_by`), any of them."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    if not isinstance(fn, type | types.FunctionType | types.BuiltinFunctionType):
        fn = type(fn)
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or name == "builtins":
        return set()
    qualname = getattr(fn, "__qualname__", "")
    if name != "__main__" and "<" not in qualname:
        values = [module, *vars(module).values()]
    elif isinstance(fn, types.FunctionType):
        values = [fn.__globals__.get(ref) for ref in code_names(fn.__code__)]
    else:
        return set()
    return {top for value in values if (top := _top_of(value))}


def names_to_teach(taught: set[str]) -> list[str]:
    """The names of the installed modules learned that ``taught`` lacks (which gains them):
    what a backend whose launchers run on other hosts sends with its requests there, where
    `learn_names` resolves them."""
    return [name for name, _ in learned_since(taught)]


def learn_names(names: Iterable[str]) -> None:
    """On a worker host: learn those of the top-level modules ``names`` that are installed
    here (looked up, not imported), so this process's launchers import them before their
    next fork, as the executor's host's launcher does (`names_to_teach`)."""
    import importlib.util

    found = []
    for name in names:
        if not (isinstance(name, str) and name.isidentifier()) or name in _NEVER:
            continue
        try:
            spec = importlib.util.find_spec(name)  # (a top-level name: nothing is imported)
        except (ImportError, ValueError):
            continue
        origin = None if spec is None else spec.origin
        if isinstance(origin, str) and installed(origin):
            found.append((name, origin))
    learn(found)


_NEVER = frozenset({"__main__", "builtins", "fiberexec"})  # never taught


def _installed_of(tops: set[str]) -> list[Module]:
    """Those of the top-level modules ``tops`` that this process has and are installed."""
    found = []
    for top in sorted(tops - _NEVER):
        origin = getattr(sys.modules.get(top), "__file__", None)
        if isinstance(origin, str) and installed(origin):
            found.append((top, origin))
    return found


def _top_of(value: object) -> str:
    """The top-level package ``value`` (a module, class or function) comes from, or ""."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    elif isinstance(value, type | types.FunctionType | types.BuiltinFunctionType):
        name = getattr(value, "__module__", None) or ""
    else:
        return ""
    return name.partition(".")[0] if isinstance(name, str) else ""


# ---------------------------------------------------------------------------- in the launcher


def import_learned(modules: Sequence[Module]) -> bool:
    """In the launcher: import each module that resolves to the file a worker loaded it
    from; whether any was imported. One that cannot be imported here is skipped quietly:
    workers import it themselves, as before."""
    import importlib
    import importlib.util

    imported = False
    for name, origin in modules:
        if name in sys.modules or not installed(origin):
            continue
        try:
            spec = importlib.util.find_spec(name)  # (a top-level name: nothing is imported)
            if spec is None or spec.origin is None or not _same_file(spec.origin, origin):
                continue
            importlib.import_module(name)
        except Exception:  # (the worker that needs it says why)
            continue
        imported = True
    return imported


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def fresh_random_state() -> None:
    """In a forked child: numpy's global generator, created when the launcher imported
    numpy, seeded afresh (Python's ``random`` is reseeded after a fork by Python itself), so
    workers draw different numbers, as workers that imported numpy themselves do."""
    random = sys.modules.get("numpy.random")
    if random is not None:
        with contextlib.suppress(Exception):
            random.seed()
