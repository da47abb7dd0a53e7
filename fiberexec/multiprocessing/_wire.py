"""Pickling for queues, pipes, processes and managers: pickle 5, cloudpickle when needed.

Objects of the standard library's `multiprocessing` travel as its own pickler sends them
(`multiprocessing.reduction.ForkingPickler`'s reducers): a stdlib `Connection` or socket
is handed to the process that unpickles it on this host (`multiprocessing.resource_sharer`).
While a `Process` is pickled to start it (``spawning``), stdlib objects that may only be
"shared through inheritance" (locks, semaphores, conditions, events, shared ctypes, queues)
may be pickled too, as the stdlib allows when it spawns a child: they are re-opened by
name or file descriptor there, so on this host only.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from typing import Any

from fiberexec import _inherit
from fiberexec._errors import SerializationError

PROTOCOL = 5
_GLOBAL = pickle.STACK_GLOBAL  # how protocol 5 refers to any class or function


def _shared_fd(fd: int) -> Any:
    """A child we start fetches each file descriptor pickled for it once, from this
    process, through `multiprocessing.resource_sharer` (a Unix socket on this host)."""
    from multiprocessing import resource_sharer

    return resource_sharer.DupFd(fd)


def dumps(obj: Any, *, what: str = "object", spawning: bool = False) -> bytes:
    """Pickle ``obj`` by reference when possible, by value (cloudpickle) otherwise;
    ``spawning``: ``obj`` starts a process (see the module)."""
    if not spawning:
        try:
            data = pickle.dumps(obj, protocol=PROTOCOL)
            if _GLOBAL not in data or (b"__main__" not in data
                                       and _inherit.NEEDS_STDLIB not in data):
                return data  # plain data names no global at all: one byte scan decides
        except Exception:
            pass
    try:
        buffer = io.BytesIO()
        with _inherit.spawning(_shared_fd) if spawning else contextlib.nullcontext():
            _inherit.Pickler(buffer, protocol=PROTOCOL).dump(obj)
        return buffer.getvalue()
    except Exception as exc:
        raise SerializationError(
            f"cannot pickle the {what}: {type(exc).__name__}: {exc}; "
            "send picklable objects (module-level functions and classes, plain data)"
        ) from exc


def pickler_error(exc: BaseException) -> BaseException:
    """What the pickler raised under our pickling error ``exc`` (``RuntimeError``,
    ``TypeError``...), as the standard library raises it, with our explanation attached as
    a note; ``exc`` itself if there is no such error."""
    original = exc.__cause__
    if not isinstance(original, Exception):
        return exc
    original.add_note(str(exc))
    return original


def dumps_as_stdlib(obj: Any, *, what: str = "object") -> bytes:
    """`dumps`, but raising what the pickler raised (see `pickler_error`), as the standard
    library does where it pickles."""
    try:
        return dumps(obj, what=what)
    except SerializationError as exc:
        error = pickler_error(exc)
        if error is exc:
            raise
        raise error from None


def loads(data: bytes | memoryview, *, what: str = "object") -> Any:
    """Unpickle bytes that came from an authenticated peer."""
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise SerializationError(
            f"cannot unpickle the {what}: {type(exc).__name__}: {exc}"
        ) from exc
