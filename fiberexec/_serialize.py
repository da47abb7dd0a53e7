"""Pickling for the wire: protocol 5 with out-of-band buffers, cloudpickle where needed.

A `Payload` is the pickle stream plus its out-of-band buffers (numpy arrays, bytearrays), so
large data is never copied into the stream. The fast path is the C pickler; cloudpickle takes
over for what it cannot do by reference (lambdas, closures, anything from ``__main__``),
with the standard library's multiprocessing reducers (a stdlib ``Connection`` is handed to
the worker as `ProcessPoolExecutor` hands it, see `_inherit`).
"""

from __future__ import annotations

import pickle
import traceback
import types
from collections.abc import Sequence
from concurrent.futures.process import _RemoteTraceback
from dataclasses import dataclass
from typing import Any

from fiberexec import _inherit
from fiberexec._errors import PicklingError, SerializationError, UnpicklingError

#: The standard library's class, so ``type(exc.__cause__)`` is what stdlib code expects.
RemoteTraceback = _RemoteTraceback

PROTOCOL = 5


@dataclass(slots=True)
class Payload:
    data: bytes
    buffers: Sequence[memoryview] = ()  # no list for the many payloads without buffers

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(b.nbytes for b in self.buffers)


def dumps(obj: Any, *, what: str = "object") -> Payload:
    """Pickle ``obj``; raise `PicklingError` naming ``what`` when it cannot be.

    A ``SystemExit`` raised by an object's ``__reduce__`` is let through, as the standard
    library does: the caller reports it as what the task raised.
    """
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = pickle.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append)
        if b"__main__" not in data and _inherit.NEEDS_STDLIB not in data:
            return Payload(data, [b.raw() for b in buffers]) if buffers else Payload(data)
    except Exception:
        pass
    buffers.clear()
    try:
        data = _inherit.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append,
                              for_workers=False)
    except Exception as exc:
        raise PicklingError(
            f"cannot pickle the {what}: {type(exc).__name__}: {exc}; "
            "tasks need picklable functions, arguments and results"
        ) from exc
    return Payload(data, [b.raw() for b in buffers]) if buffers else Payload(data)


def dumps_for_workers(obj: Any, *, what: str) -> Payload:
    """`dumps` for what every worker gets as it starts (the initializer and its arguments):
    the stdlib's process-shared objects in it pickle as for a spawned child (`_inherit`)."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = _inherit.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append)
    except Exception as exc:
        raise PicklingError(f"cannot pickle the {what}: {type(exc).__name__}: {exc}") from exc
    return Payload(data, [b.raw() for b in buffers]) if buffers else Payload(data)


def dumps_function(fn: Any) -> Payload:
    """Pickle a callable: by reference when importable, by value (cloudpickle) otherwise.

    A plain function pickled by reference is only its module and name, the same bytes every
    time: those are kept (per function object), so a task costs no pickling of its function.
    By value (lambdas, closures, ``__main__``) it is pickled again each time: a global it
    reads may have changed.
    """
    if isinstance(fn, _PLAIN_FUNCTIONS):
        cached = _by_reference.get(fn)
        if cached is not None:
            return cached
        try:
            data = pickle.dumps(fn, protocol=PROTOCOL)
        except Exception:
            data = b"__main__"  # not importable: by value below
        if b"__main__" not in data:
            if len(_by_reference) >= BY_REFERENCE_MAX:
                _by_reference.clear()
            payload = _by_reference[fn] = Payload(data)
            return payload
    return dumps(fn, what=f"function {fn!r}")


_PLAIN_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)
BY_REFERENCE_MAX = 256
_by_reference: dict[Any, Payload] = {}


def loads(payload: Payload, *, what: str = "object") -> Any:
    """Unpickle; raise `UnpicklingError` naming ``what`` when it cannot be.

    ``SystemExit`` raised while rebuilding an object counts as a failure to unpickle it: it
    must not end the thread (or the worker) that happens to be unpickling.
    """
    try:
        return pickle.loads(payload.data, buffers=payload.buffers)
    except (Exception, SystemExit) as exc:
        raise UnpicklingError(
            f"cannot unpickle the {what}: {type(exc).__name__}: {exc}"
        ) from exc


def dumps_exception(exc: BaseException) -> Payload:
    """Pickle a task's exception with its formatted traceback; degrade, never fail."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f'\n"""\n{tb}"""'
    exc.__traceback__ = None
    try:
        return dumps((exc, text), what="exception")
    except SerializationError as err:
        fallback = PicklingError(f"the task raised an exception that {err}: {exc!r}")
        return dumps((fallback, text), what="exception")


def remote_traceback(text: str) -> BaseException:
    """The standard library's carrier of a traceback from another process."""
    return RemoteTraceback(text)  # type: ignore[arg-type]  # typeshed says traceback; it is text


def loads_exception(payload: Payload) -> BaseException:
    """Rebuild a task's exception with the remote traceback in ``__cause__``."""
    exc, text = loads(payload, what="exception raised by the task")
    exc.__cause__ = remote_traceback(text)
    return exc  # type: ignore[no-any-return]
