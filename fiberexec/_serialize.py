"""Pickling, for the executor's tasks and for `fiberexec.multiprocessing`: protocol 5, the C
pickler first, cloudpickle where it cannot pickle by reference (lambdas, closures, anything
from ``__main__``), with the standard library's multiprocessing reducers (`_inherit`).

A task's `Payload` is the pickle stream plus its out-of-band buffers (numpy arrays,
bytearrays), so large data is never copied into the stream; a stdlib ``Connection`` is handed
to the worker as `ProcessPoolExecutor` hands it. Queues, pipes, processes and managers send
one stream (`dumps_bytes`): a stdlib `Connection` or socket is handed to the process that
unpickles it on this host (`multiprocessing.resource_sharer`). While a `Process` is pickled
to start it (``spawning``), stdlib objects that may only be "shared through inheritance"
(locks, semaphores, conditions, events, shared ctypes, queues) may be pickled too, as the
stdlib allows when it spawns a child: they are re-opened by name or file descriptor there,
so on this host only.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import sys
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fiberexec import _byvalue, _errors
from fiberexec._errors import PerformanceWarning, PicklingError, SerializationError, pickling_error
from fiberexec._record import Record

if TYPE_CHECKING:
    # the standard library's class (``type(exc.__cause__)`` is what stdlib code expects),
    # made this module's ``RemoteTraceback`` by `__getattr__` below
    from concurrent.futures.process import _RemoteTraceback

    RemoteTraceback = _RemoteTraceback

# What a worker needs only on a rarer path is imported there: cloudpickle and the stdlib's
# reducers (`_inherit`), and ``concurrent.futures.process`` (the remote traceback's class),
# about 30 ms of a new interpreter's start (a worker's, on every backend but the local
# launcher's forks).

PROTOCOL = 5
# a plain pickle naming this module needs the stdlib's reducers: a stdlib Connection
# pickles without them, but as a file descriptor number, meaningless in another process
NEEDS_STDLIB = b"multiprocessing.connection"


class Payload(Record):
    """A pickle stream and its out-of-band buffers (sent apart, never copied into it)."""

    __slots__ = ("buffers", "data")

    def __init__(self, data: bytes, buffers: Sequence[memoryview] = ()) -> None:
        self.data = data
        self.buffers = buffers  # no list for the many payloads without buffers

    @property
    def nbytes(self) -> int:
        if not self.buffers:  # (most: a result's size is counted for every task)
            return len(self.data)
        return len(self.data) + sum(b.nbytes for b in self.buffers)


def dumps(obj: Any, *, what: str = "object", functions_as_bytes: bool = False,
          by_value: bool = False, main_marks: int = 0,
          main_by_reference: Callable[[], bool] | None = None) -> Payload:
    """Pickle ``obj``; raise `PicklingError` naming ``what`` when it cannot be.

    What an object's ``__reduce__`` raises beyond ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) is let through: the caller fails the task with it. ``functions_as_bytes``
    (a task's arguments): a function in ``obj`` pickled by value travels as its kept bytes,
    which a worker rebuilds once (`fiberexec._functions`). ``by_value``: go straight to the
    pickler that pickles by value (the caller expects the plain one to meet the script's
    objects, and would pickle everything twice: see `by_value_needed`). ``main_marks``: how
    often ``__main__`` is in bytes ``obj`` carries on purpose (functions by value, as
    `fiberexec._functions.Kept`); more in the plain pickle is the script's by reference,
    which stands if ``main_by_reference`` says the reader resolves those names to the same
    objects (a worker's result: see `fiberexec._mainspace.by_reference`).
    """
    buffers: list[pickle.PickleBuffer] = []
    apart = _Buffers(buffers)
    first: Exception | None = None  # what the plain pickler raised, if it did
    try:
        if by_value:
            raise _ByValue
        data = pickle.dumps(obj, protocol=PROTOCOL, buffer_callback=apart)
        if MP_MAIN in data:  # by reference to a script that workers cannot import
            _mp_main_by_value()
        elif NEEDS_STDLIB not in data and (
                data.count(b"__main__") == main_marks
                or (main_by_reference is not None and main_by_reference())):
            if apart.readonly and "numpy" in sys.modules:
                buffers.clear()
                data = _writable_arrays(obj, apart)
            if not buffers and len(data) < STREAM_APART:  # nearly every task's arguments
                return Payload(data)
            return _payload(data, buffers)
    except _ByValue:
        pass
    except Exception as exc:
        first = exc
    buffers.clear()
    from fiberexec import _inherit

    try:
        data = _inherit.dumps(obj, protocol=PROTOCOL, buffer_callback=apart,
                              functions_as_bytes=functions_as_bytes)
    except Exception as exc:
        # Where cloudpickle says PicklingError, the plain pickler may have said what it was
        # (a RecursionError for a structure too deep): that one is named, and raised as.
        if first is not None and type(exc) is pickle.PicklingError:
            exc = first
        error = pickling_error(
            f"cannot pickle the {what}: {type(exc).__name__}: {exc}; "
            f"{_advice(exc) or 'tasks need picklable functions, arguments and results'}", exc)
        error.shown, error.reason = _shown(obj), repr(exc)
        buffers.clear()
        raise error from exc
    finally:
        first = None  # (its traceback holds this frame: a cycle through what it holds)
    return _payload(data, buffers)


_SCALARS = frozenset((int, float, bool, complex, type(None)))
SHORT_TEXT = 4096  # a str or bytes argument this long or shorter counts as a scalar
FLAT_MAX = 256  # a list or tuple of at most this many scalars is pickled at once too


def _is_scalar(value: Any) -> bool:
    kind = type(value)  # (exact types only: nothing of the object's own code runs here)
    return kind in _SCALARS or ((kind is str or kind is bytes) and len(value) <= SHORT_TEXT)


def _is_flat(value: Any) -> bool:
    """A list or tuple (the exact types) of at most `FLAT_MAX` scalars: a chunk of a map,
    or its results."""
    kind = type(value)
    if (kind is not tuple and kind is not list) or len(value) > FLAT_MAX:
        return False
    scalars = _SCALARS
    for item in value:
        kind = type(item)
        if kind not in scalars and not ((kind is str or kind is bytes)
                                        and len(item) <= SHORT_TEXT):
            return False
    return True


def _is_module_builtin(value: Any) -> bool:
    """A function of a C module (``abs``, ``math.sqrt``): it pickles as its module's name and
    its own, which every worker resolves as this process does."""
    return (type(value) is types.BuiltinFunctionType
            and type(value.__self__) is types.ModuleType
            and value.__module__ not in (None, "__main__", "__mp_main__"))


def dumps_scalars(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Payload | None:
    """``(args, kwargs)`` pickled at once when every value is a number, None, a short str
    or bytes (the exact types), a list or tuple of those (`FLAT_MAX` at most), or a C
    module's function, which is what most tasks take, and a map's chunks of such items:
    nothing in them can be the script's, a function pickled by value, a buffer or a
    stream long enough to travel apart, so none of `dumps`' looks is needed. None for
    anything else (`dumps` is for those, and says what cannot be pickled)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if not (_is_scalar(value) or _is_flat(value) or _is_module_builtin(value)):
            return None
    try:
        data = pickle.dumps((args, kwargs), protocol=PROTOCOL)
    except Exception:  # (a module's function its module does not name, say): `dumps` says
        return None
    return Payload(data) if len(data) < STREAM_APART else None  # (long: `dumps` sends apart)


def dumps_scalar(value: Any) -> Payload | None:
    """``value`` pickled at once when it is a number, None, a short str or bytes (the exact
    types), or a list or tuple of those, as most tasks' results are, and a chunk's (see
    `dumps_scalars`); None for anything else."""
    if _is_scalar(value) or _is_flat(value):
        data = pickle.dumps(value, protocol=PROTOCOL)
        if len(data) < STREAM_APART:  # (long: `dumps` sends it apart)
            return Payload(data)
    return None


_FORK_SEMLOCK = "A SemLock created in a fork context"  # (the stdlib's message starts so)


def _advice(exc: BaseException) -> str:
    """What to do about a pickling failure, where there is more to say than that it must
    be picklable ("" otherwise): for a lock, queue or semaphore that only a forked child
    can open, where to make one that workers can."""
    if isinstance(exc, RuntimeError) and str(exc).startswith(_FORK_SEMLOCK):
        return ("it is a multiprocessing lock, semaphore, condition, event or queue made "
                "for forked children (the default 'fork' start method), which only "
                "processes forked from this one can open, and workers are not: make it "
                "with fiberexec.multiprocessing (fiberexec.multiprocessing.RLock(), "
                "...) or multiprocessing.get_context('spawn')")
    return ""


class _ByValue(Exception):  # (not an error: the plain pickler is skipped)
    """Raised where the plain pickler would run, when the caller asked to skip it."""


def by_value_needed(payload: Payload, main_marks: int = 0) -> bool:
    """Whether ``payload`` carries something of the script (``__main__``) by value, beyond
    ``main_marks`` (see `dumps`): the next arguments of the same kind likely do too (pass
    ``by_value`` to `dumps`)."""
    return payload.data.count(b"__main__") > main_marks


def script_objects(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether arguments plainly hold an object of the script's (``__main__``): one of
    them, or the first item of one that is a list, tuple or dict (a look, not a walk)."""
    return any(_of_script(value, 2) for value in (*args, *kwargs.values()))


def _of_script(value: Any, depth: int) -> bool:
    kind = type(value)  # (exact types only: nothing of the object's own code runs here)
    if kind.__module__ == "__main__":
        return True
    if kind is types.FunctionType or kind is type:
        return bool(value.__module__ == "__main__")
    if depth:
        if (kind is list or kind is tuple) and len(value):
            return _of_script(value[0], depth - 1)
        if kind is dict and len(value):
            return _of_script(next(iter(value.values())), depth - 1)
    return False


def _shown(obj: object) -> str:
    """What could not be pickled, as a short repr (a `Pool`'s `MaybeEncodingError` shows it)."""
    import reprlib

    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = 200
    try:
        return shown.repr(obj)
    except Exception as exc:  # a repr that raises: say so, rather than lose the first error
        return f"<{type(obj).__qualname__} object; its repr raised {type(exc).__name__}>"


STREAM_APART = 1 << 20  # a pickle stream this long travels as a buffer of its own
IN_BAND_MAX = 1 << 16  # a smaller pickle-5 buffer is copied into the stream instead


class _Buffers:
    """The pickler's ``buffer_callback``: a buffer of `IN_BAND_MAX` bytes or more goes into
    ``buffers`` (out of band: no copy into the stream); a smaller one stays in the stream.
    Each out-of-band buffer has its own entry in a message, and 20,000 small arrays took
    twice the stdlib's time that way (at 65,536 a message could not count them). Notes
    whether a buffer was read-only (see `_writable_arrays`)."""

    __slots__ = ("buffers", "readonly")

    def __init__(self, buffers: list[pickle.PickleBuffer]) -> None:
        self.buffers = buffers
        self.readonly = False

    def __call__(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if raw.readonly:
            self.readonly = True
        if raw.nbytes < IN_BAND_MAX:
            return True
        self.buffers.append(buffer)
        return False


def _writable_arrays(obj: Any, apart: _Buffers) -> bytes:
    """Pickle ``obj`` again, each read-only numpy array (``np.frombuffer`` of bytes, one
    whose ``writeable`` flag was cleared) as a copy that is not: pickle-5 keeps a buffer
    read-only on the other side, so the task could not update its argument in place (or
    the caller its result), where the stdlib's pickling always rebuilds a writable copy."""
    import numpy as np

    class Pickler(pickle.Pickler):
        def reducer_override(self, o: Any) -> Any:
            if type(o) in (np.ndarray, np.memmap) and not o.flags.writeable:
                return np.array(o, order="K", copy=True).__reduce_ex__(PROTOCOL)
            return NotImplemented

    out = io.BytesIO()
    Pickler(out, protocol=PROTOCOL, buffer_callback=apart).dump(obj)
    return out.getvalue()


def _payload(data: bytes, buffers: list[pickle.PickleBuffer]) -> Payload:
    """The stream and its buffers; a stream of `STREAM_APART` bytes or more (a long list of
    Python objects) becomes an out-of-band buffer itself, behind a few bytes that unpickle
    it (`_loads_apart`), so it moves as a numpy array does: through shared memory where the
    peer shares it, with no copy into a message, and no limit on a message's size."""
    if len(data) >= STREAM_APART:
        # The bytes and the buffers themselves, not memoryviews of them: a view of a view
        # holds an export on it, and the garbage collector clearing such a view in a cycle
        # (a traceback's frames holding a payload) left a NULL the release then followed,
        # a segfault (CPython's memoryview tp_clear).
        inner: list[Any] = [data, *buffers]
        outer: list[pickle.PickleBuffer] = []
        stub = pickle.dumps(_Apart(inner), protocol=PROTOCOL, buffer_callback=outer.append)
        return Payload(stub, [b.raw() for b in outer])
    return Payload(data, [b.raw() for b in buffers]) if buffers else Payload(data)


class _Apart:
    """Pickles to ``_loads_apart(stream, *buffers)``, each one out of band."""

    __slots__ = ("views",)

    def __init__(self, views: list[Any]) -> None:
        self.views = views  # (bytes and `PickleBuffer`s, each pickled as a buffer)

    def __reduce__(self) -> tuple[Any, tuple[pickle.PickleBuffer, ...]]:
        return _loads_apart, tuple(pickle.PickleBuffer(v) for v in self.views)


def _loads_apart(stream: memoryview, *buffers: memoryview) -> Any:
    return pickle.loads(stream, buffers=buffers)


def streamed_apart(payload: Payload) -> bool:
    """Whether ``payload`` is a long pickle stream travelling as a buffer (see `_payload`):
    its first buffer is the stream, costly to unpickle (Python objects, 4 ms a MiB), cheap to
    hash (0.7 ms a MiB)."""
    return (bool(payload.buffers) and len(payload.data) < _STUB_MAX
            and _APART_MARK in payload.data)


_APART_MARK = _loads_apart.__name__.encode()
_STUB_MAX = 256  # bytes of the pickle that calls `_loads_apart` (about 70)


def dumps_for_workers(obj: Any, *, what: str) -> Payload:
    """`dumps` for what every worker gets as it starts (the initializer and its arguments):
    the stdlib's process-shared objects in it pickle as for a spawned child (`_inherit`)."""
    from fiberexec import _inherit

    buffers: list[pickle.PickleBuffer] = []
    try:
        data = _inherit.dumps(obj, protocol=PROTOCOL, buffer_callback=_Buffers(buffers),
                              dup_fd=_inherit.HostFd)
    except Exception as exc:
        advice = _advice(exc)
        raise PicklingError(f"cannot pickle the {what}: {type(exc).__name__}: {exc}"
                            + (f"; {advice}" if advice else "")) from exc
    return Payload(data, [b.raw() for b in buffers]) if buffers else Payload(data)


class Snapshot:
    """One ``map`` call's functions as pickled when it was called (`pinned`): its tasks read
    the globals as they were then, whichever batch they go in."""

    __slots__ = ("kept", "pinned")

    def __init__(self) -> None:
        self.kept: dict[int, tuple[Any, Payload]] = {}  # id -> the function, its pickle
        self.pinned = False


def dumps_function(fn: Any, snapshot: Snapshot | None = None) -> Payload:
    """Pickle a callable: by reference when importable, by value (cloudpickle) otherwise.

    A plain function pickled by reference is only its module and name, the same bytes every
    time: those are kept (per function object), so a task costs no pickling of its function.
    By value (lambdas, closures, ``__main__``), the bytes are kept while nothing the function
    reads can have changed (`_byvalue`), else it is pickled again: a global it reads may
    have changed. Within one ``map`` call (``snapshot``), it is pickled once: a large table
    it reads was pickled again for each batch, 13 ms a time for a 200,000-item dict, where
    the stdlib's workers read the copy they forked (or imported) when they started.
    """
    if snapshot is None:
        return _dumps_function(fn)
    kept = snapshot.kept.get(id(fn))
    if kept is not None and kept[0] is fn:
        if ONE_SHOT in kept[1].data:  # its first message takes it; the next, a new one
            del snapshot.kept[id(fn)]
        return kept[1]
    payload = _dumps_function(fn)
    if not snapshot.pinned or ONE_SHOT not in payload.data:
        snapshot.kept[id(fn)] = (fn, payload)
    return payload


# In a pickle that opens once: a socket or descriptor a global holds, lent to the first
# process that unpickles it (the stdlib's resource sharer), so pickled for each message
ONE_SHOT = b"resource_sharer"


def _dumps_function(fn: Any) -> Payload:
    if isinstance(fn, _PLAIN_FUNCTIONS):
        cached = _by_reference.get(fn)
        if cached is not None:
            return cached
        if type(fn) is types.FunctionType and _byvalue.known(fn):
            return _by_value(fn)
        try:
            data = pickle.dumps(fn, protocol=PROTOCOL)
        except Exception:
            data = b"__main__"  # not importable: by value below
        if MP_MAIN in data:
            _mp_main_by_value()
            data = b"__main__"
        if b"__main__" not in data:
            if len(_by_reference) >= BY_REFERENCE_MAX:
                _by_reference.clear()
            payload = _by_reference[fn] = Payload(data)
            return payload
        if type(fn) is types.FunctionType:
            return _by_value(fn)
    return dumps(fn, what=f"function {fn!r}")


MP_MAIN = b"__mp_main__"  # the script, in a child the stdlib's spawn started


def _mp_main_by_value() -> None:
    """In a stdlib spawn child the script is ``__mp_main__``, importable there but not in a
    worker: its functions and classes travel by value, as a script's ``__main__`` ones do."""
    module = sys.modules.get(MP_MAIN.decode())
    if module is not None:
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)


def by_value_bytes(fn: types.FunctionType, snapshot: Snapshot | None = None) -> bytes | None:
    """``fn``'s by-value pickle (kept while fresh, see `_byvalue`, or for a ``map`` call);
    None when it is pickled by reference, or carries large buffers."""
    payload = dumps_function(fn, snapshot)
    if payload.buffers or _by_reference.get(fn) is payload:
        return None
    return payload.data


def _by_value(fn: types.FunctionType) -> Payload:
    payload = _byvalue.dumps(fn, lambda: dumps(fn, what=f"function {fn!r}"),
                             lambda payload: not payload.buffers)
    if (payload.nbytes >= HEAVY_FUNCTION and fn not in _said_heavy
            and _byvalue.pickled_each_time(fn)):
        _said_heavy.add(fn)
        _say_heavy(fn, payload.nbytes)
    return payload


HEAVY_FUNCTION = 1 << 20  # a function pickled by value again and again at this size: said
_said_heavy: weakref.WeakSet[Any] = weakref.WeakSet()


def _say_heavy(fn: types.FunctionType, nbytes: int) -> None:
    """Tell once that ``fn`` travels with large data that it reads from its globals."""
    def size(value: Any) -> str:
        held = len(value) if isinstance(value, bytes | bytearray) else getattr(
            value, "nbytes", None)
        if isinstance(held, int):
            return f"{type(value).__name__} of {held / 2**20:.1f} MiB"
        if hasattr(value, "__len__"):
            return f"{type(value).__name__} of {len(value):,} items"
        return type(value).__name__

    found = ", ".join(f"{name} ({size(value)})"
                      for name, value in _byvalue.changeable_globals(fn)[:5])
    # A warning, shown where the function is defined: a 100-fold slowdown is worth the
    # stderr line that logging (quiet unless the program sets it up) would not give.
    code = fn.__code__
    warnings.warn_explicit(
        f"{fn.__qualname__}() is sent by value with the globals it reads "
        f"({nbytes / 2**20:.1f} MiB, pickled again for each map call, and for every batch "
        f"of tasks submitted one by one, as any of them may have changed in place"
        f"{f': {found}' if found else ''}); to send data once, "
        "pass it to the executor's initializer, put it in a module the workers import, or "
        "make it immutable (a tuple, bytes)", PerformanceWarning, code.co_filename,
        code.co_firstlineno, module=fn.__module__)


_PLAIN_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)
BY_REFERENCE_MAX = 256
_by_reference: dict[Any, Payload] = {}


def loads(payload: Payload, *, what: str = "object") -> Any:
    """Unpickle; raise `UnpicklingError` naming ``what`` when it cannot be.

    Whatever rebuilding an object raises (``SystemExit`` and ``KeyboardInterrupt`` too)
    counts as a failure to unpickle it: it must not end the thread (the executor's
    scheduler, or the worker) that happens to be unpickling.
    """
    try:
        return pickle.loads(payload.data, buffers=payload.buffers)
    except BaseException as exc:
        raise _errors.UnpicklingError(
            f"cannot unpickle the {what}: {type(exc).__name__}: {exc}"
        ) from exc


def dumps_exception(exc: BaseException) -> Payload:
    """Pickle a task's exception with its formatted traceback; degrade, never fail.

    The exception is pickled on its own, inside: where the executor cannot rebuild it, the
    traceback still arrives (see `loads_exception`)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f'\n"""\n{tb}"""'
    with contextlib.suppress(Exception):  # (a frozen dataclass refuses: it goes with it)
        exc.__traceback__ = None
    try:
        raised = dumps_bytes(exc, what="exception")
    except SerializationError as err:
        cause = err.__cause__
        fallback = pickling_error(
            f"the task raised {_shown(exc)}, which cannot be pickled to be sent back: "
            f"{type(cause).__name__}: {cause}", cause)
        raised = dumps_bytes(fallback, what="exception")
    except BaseException as err:  # a ``__reduce__`` raised KeyboardInterrupt, SystemExit...:
        # the future raises that, as the stdlib's does, with where it was raised
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        text = f'\n"""\n{tb}"""'
        with contextlib.suppress(Exception):
            err.__traceback__ = None
        try:
            raised = dumps_bytes(err, what="exception")
        except BaseException:
            raised = dumps_bytes(pickling_error(
                f"the task raised {_shown(exc)}, and pickling it raised "
                f"{type(err).__name__}: {err}", None), what="exception")
    return dumps((raised, text), what="exception")


def remote_traceback(text: str) -> BaseException:
    """The standard library's carrier of a traceback from another process."""
    from concurrent.futures.process import _RemoteTraceback

    return _RemoteTraceback(text)  # type: ignore[arg-type]  # typeshed says traceback; it is text


def loads_exception(payload: Payload) -> BaseException:
    """Rebuild a task's exception with the remote traceback in ``__cause__``.

    Raises:
        UnpicklingError: it cannot be rebuilt here (its class's ``__init__`` wants other
            arguments than its ``args``, say); its ``__cause__`` is the remote traceback.
    """
    raised, text = loads(payload, what="exception raised by the task")
    try:
        exc: BaseException = pickle.loads(raised)
    except BaseException as err:  # (as `loads`: nothing raised rebuilding it escapes)
        hint = ""
        if isinstance(err, TypeError) and "__init__()" in str(err):  # the usual cause
            hint = ("; pickle rebuilds an exception by calling its class with its args, so "
                    "pass every argument of its __init__ on to super().__init__(), or give "
                    "the class a __reduce__")
        raise _errors.UnpicklingError(
            f"cannot unpickle the exception raised by the task: {type(err).__name__}: "
            f"{err}{hint}") from remote_traceback(text)
    exc.__cause__ = remote_traceback(text)
    return exc


# ---------------------------------------------------------------- one stream (multiprocessing)

_GLOBAL = pickle.STACK_GLOBAL  # how protocol 5 refers to any class or function


def _shared_fd(fd: int) -> Any:
    """A child we start fetches each file descriptor pickled for it once, from this
    process, through `multiprocessing.resource_sharer` (a Unix socket on this host)."""
    from multiprocessing import resource_sharer

    return resource_sharer.DupFd(fd)


def dumps_bytes(obj: Any, *, what: str = "object", spawning: bool = False) -> bytes:
    """Pickle ``obj`` into one stream, by reference when possible, by value (cloudpickle)
    otherwise; ``spawning``: ``obj`` starts a process (see the module)."""
    if not spawning:
        try:
            data = pickle.dumps(obj, protocol=PROTOCOL)
            if _GLOBAL not in data or (b"__main__" not in data
                                       and NEEDS_STDLIB not in data):
                return data  # plain data names no global at all: one byte scan decides
        except Exception:
            pass
    from fiberexec import _inherit

    try:
        return _inherit.dumps(obj, protocol=PROTOCOL,
                              dup_fd=_shared_fd if spawning else None)
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
    """`dumps_bytes`, but raising what the pickler raised (see `pickler_error`), as the
    standard library does where it pickles."""
    try:
        return dumps_bytes(obj, what=what)
    except SerializationError as exc:
        error = pickler_error(exc)
        if error is exc:
            raise
        raise error from None


def loads_bytes(data: bytes | memoryview, *, what: str = "object") -> Any:
    """Unpickle one stream that came from an authenticated peer."""
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise SerializationError(
            f"cannot unpickle the {what}: {type(exc).__name__}: {exc}"
        ) from exc


def loads_as_stdlib(data: bytes | memoryview) -> Any:
    """Unpickle what a process received, as the standard library's connections, queues and
    proxies do: whatever rebuilding it raises (`pickle.UnpicklingError`, or the error of
    the object's own reduction) is raised as is, for ``except`` clauses written for it."""
    return pickle.loads(data)


def __getattr__(name: str) -> Any:
    if name == "RemoteTraceback":
        from concurrent.futures.process import _RemoteTraceback

        return _RemoteTraceback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
