"""Functions pickled by value, rebuilt once per worker for the same bytes.

Functions pickled by value (lambdas, closures, anything of ``__main__``) cost tens of
microseconds to unpickle, so a worker keeps recent ones by their exact pickle bytes: the same
bytes are the same code and the same captured globals. (The executor cannot cache the other
way round: a global the function reads may change between submits; `_byvalue` keeps its
bytes only while nothing it reads can have changed.)

That holds for the function a task runs (`Tasks.functions`) and for one a task takes as an
argument: a chunk of ``map`` (the map's function rides with its items), a pool's callable,
a key function. The arguments' pickler sends such a function as its by-value bytes
(`reduce`), and the worker rebuilds it with `by_value`, from the same cache: so a chunked
map of a script's function pickles and unpickles it once, not once per chunk (it was
40 us a chunk both ways), and within a worker it stays one function object, as a forked
stdlib worker's ``__main__`` function does.
"""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any

from fiberexec import _mainspace
from fiberexec._serialize import Payload, by_value_bytes, loads

MAIN_MARK = b"__main__"  # in a pickle that carries something of the caller's script by value
RECENT_MAX = 64  # functions a worker keeps by their bytes
_recent: OrderedDict[bytes, Any] = OrderedDict()


def load(payload: Payload) -> Any:
    """The function ``payload`` holds: the one made before from the same bytes, if kept."""
    if payload.buffers:  # large captured data: not worth keeping
        return _adopted(loads(payload, what="function"), payload)
    fn = _recent.get(payload.data)
    if fn is None:
        fn = _adopted(loads(payload, what="function"), payload)
        _recent[payload.data] = fn
        if len(_recent) > RECENT_MAX:
            _recent.popitem(last=False)
    else:
        _recent.move_to_end(payload.data)
        if not _mainspace.current(fn):  # a newer copy took its name: this one runs now
            _mainspace.adopt(fn)
    return fn


def by_value(data: bytes) -> Any:
    """(Unpickling) A function an argument carried as its by-value bytes (see `reduce`)."""
    return load(Payload(data))


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
    if MAIN_MARK in payload.data:
        fn = _mainspace.home(fn)
        _mainspace.adopt(fn)
    return fn
