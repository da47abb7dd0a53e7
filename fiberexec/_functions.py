"""Functions pickled by value, rebuilt once per worker for the same bytes.

Functions pickled by value (lambdas, closures, anything of ``__main__``) cost tens of
microseconds to unpickle, so a worker keeps recent ones by their exact pickle bytes: the same
bytes are the same code and the same captured globals. (The executor cannot cache the other
way round: a global the function reads may change between submits; `_byvalue` keeps its
bytes only while nothing it reads can have changed.)

That holds for the function a task runs (`Tasks.functions`) and for one a task takes as an
argument: a chunk of ``map`` (the map's function rides with its items), a pool's callable,
a key function. The arguments' pickler sends such a function as its by-value bytes
(`reduce`; the shard puts a `Kept` in its place first, so that the standard library's
pickler, not cloudpickle, pickles the items around it), and the worker rebuilds it with
`by_value`, from the same cache: so a chunked
map of a script's function pickles and unpickles it once, not once per chunk (it was
40 us a chunk both ways), and within a worker it stays one function object, as a forked
stdlib worker's ``__main__`` function does.
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from typing import Any

from fiberexec import _mainspace
from fiberexec._serialize import Payload, Snapshot, by_value_bytes, loads, streamed_apart

MAIN_MARK = b"__main__"  # in a pickle that carries something of the caller's script by value
RECENT_MAX = 64  # functions a worker keeps by their bytes
LARGE_MAX = 2  # ...and of those with a long pickle (a map's function, the one before)
# bytes (or digest) -> the function made from them, as it was unpickled, and
# `_mainspace.placings` when its globals were last put on __main__ (see `load`)
_recent: OrderedDict[bytes, tuple[Any, Any, int]] = OrderedDict()
_large: OrderedDict[bytes, tuple[Any, Any, int]] = OrderedDict()


def load(payload: Payload) -> Any:
    """The function ``payload`` holds: the one made before from the same bytes, if kept.

    One that reads a large table (a long pickle, travelling apart: `streamed_apart`) is
    known by the digest of its bytes, and at most `LARGE_MAX` of those are kept: it came
    with every batch of a map, and was unpickled each time (10 ms for a 200,000-item dict).
    One with large buffers of its own (an array it reads) is cheaper to unpickle than to
    hash, and is not kept."""
    if not payload.buffers:
        key, recent, most = payload.data, _recent, RECENT_MAX
    elif streamed_apart(payload):
        digests = (hashlib.sha256(buffer).digest() for buffer in payload.buffers)
        key, recent, most = payload.data + b"".join(digests), _large, LARGE_MAX
    else:
        return _adopted(loads(payload, what="function"), payload)
    kept = recent.get(key)
    if kept is None:
        loaded = loads(payload, what="function")
        fn = _adopted(loaded, payload)
        recent[key] = (fn, loaded, _mainspace.placings)
        if len(recent) > most:
            recent.popitem(last=False)
        return fn
    recent.move_to_end(key)
    fn, loaded, placings = kept
    if fn is not loaded and placings != _mainspace.placings:
        # On __main__'s namespace, where another function put its globals since: the
        # globals this one brought go there again
        _mainspace.refresh(loaded)
        recent[key] = (fn, loaded, _mainspace.placings)
    if not _mainspace.current(fn):  # a newer copy took its name: this one runs now
        _mainspace.adopt(fn)
    return fn


def by_value(data: bytes) -> Any:
    """(Unpickling) A function an argument carried as its by-value bytes (see `reduce`)."""
    return load(Payload(data))


class Kept:
    """A function by value, as its kept bytes: pickles as a call of `by_value`, so the
    standard library's pickler (no cloudpickle, no Python code per object) can pickle the
    arguments around it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return by_value, (self.data,)


def kept_functions(args: tuple[Any, ...], snapshot: Snapshot | None = None
                   ) -> tuple[tuple[Any, ...], int]:
    """``args`` with each function among them that travels by value as a `Kept` (a chunk
    of ``map`` carries the map's function first, pickled once for the map's ``snapshot``),
    and how often ``__main__`` is in their bytes (those marks are no sign of the script's
    objects by reference: see `dumps`)."""
    kept: list[Any] | None = None
    marks, seen = 0, set()
    for i, arg in enumerate(args):
        if type(arg) is not types.FunctionType:
            continue
        data = by_value_bytes(arg, snapshot)
        if data is not None:
            if kept is None:
                kept = list(args)
            kept[i] = Kept(data)
            if id(data) not in seen:  # the same bytes twice are pickled once
                seen.add(id(data))
                marks += data.count(MAIN_MARK)
    return (args, 0) if kept is None else (tuple(kept), marks)


def reduce(fn: Any) -> tuple[Any, tuple[bytes]] | None:
    """(Pickling arguments) ``fn`` as its by-value bytes, rebuilt by `by_value`; None for a
    function pickled by reference (its name is all it costs) or with large captured data."""
    if type(fn) is not types.FunctionType:
        return None
    data = by_value_bytes(fn)
    return None if data is None else (by_value, (data,))


def _adopted(fn: Any, payload: Payload) -> Any:
    """``fn``, its main-script functions and classes now ``__main__``'s (`_mainspace`), on
    its namespace."""
    if MAIN_MARK in payload.data or (streamed_apart(payload)
                                     and MAIN_MARK in payload.buffers[0].tobytes()):
        fn = _mainspace.home(fn)
        _mainspace.adopt(fn)
    return fn
