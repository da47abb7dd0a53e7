"""The start method ``"fiber"``, known to the standard library's `multiprocessing`.

Libraries that start processes take a start method's name and look it up in the standard
library (``SubprocVecEnv(env_fns, start_method="fiber")`` in Stable-Baselines3,
``AsyncVectorEnv(env_fns, context="fiber")`` in gymnasium: each calls
``multiprocessing.get_context(name)``). Once fiberexec is imported, that name gives
`fiberexec.multiprocessing`'s context, so such a library starts fiberexec's processes, pipes
and queues with no other change. Libraries that take the context itself check that it is one
of the standard library's (``DataLoader(multiprocessing_context=ctx)`` in torch): it is an
instance of ``multiprocessing.context.BaseContext``, as is the stand-in below. And
``multiprocessing.set_start_method("fiber")`` makes it the standard library's default: its
``Process``, ``Pool``, queues, ``Manager`` and ``ProcessPoolExecutor()`` then run on it.

The standard library has no call to add a start method, so the name goes into its table of
contexts (``multiprocessing.context._concrete_contexts``), beside ``fork``, ``spawn`` and
``forkserver``; nothing else of the standard library changes. ``import fiberexec`` takes
milliseconds and `fiberexec.multiprocessing` a tenth of a second, so until that is imported a
stand-in holds the place and imports it on first use.

A child the standard library spawns (its ``spawn`` or ``forkserver`` context, which
libraries pick for themselves) is told its parent's start method and sets it before it
imports anything of the parent's: the name it receives is pickled so that unpickling it
imports fiberexec first, which registers the name there too.
"""

from __future__ import annotations

import multiprocessing.context
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typeshed's signatures name the standard library's own types
    _StdContext = object
else:  # a context here is one of the standard library's at run time: libraries check it
    # (``isinstance(ctx, multiprocessing.context.BaseContext)`` in torch's ``DataLoader``)
    _StdContext = multiprocessing.context.BaseContext


class _Name(str):
    """The name as the standard library's contexts hand it to a spawned child (in
    ``multiprocessing.spawn.get_preparation_data``): it unpickles through `_registered`."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Callable[[], str], tuple[()]]:
        return _registered, ()


def _registered() -> str:
    """The name, in a process that now knows it (importing this module imported the
    package, which registers it)."""
    register()
    return str.__str__(NAME)


NAME: str = _Name("fiber")


class _Deferred(_StdContext):
    """The ``"fiber"`` context until `fiberexec.multiprocessing` is imported: each attribute
    is the real context's (``ctx.Process``, ``ctx.Pipe()``, ``ctx.get_start_method()``),
    none the standard library's class would give."""

    def _check_available(self) -> None:
        """What the standard library's ``get_context`` asks of a context: it is (and asking
        imports nothing)."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__") or name == "_check_available":
            return object.__getattribute__(self, name)
        from fiberexec.multiprocessing import _context

        return getattr(_context.get_context(NAME), name)

    def __repr__(self) -> str:
        return f"<fiberexec.multiprocessing context {NAME!r}>"


def register(context: object | None = None) -> None:
    """Make ``multiprocessing.get_context("fiber")`` return ``context`` (None: the stand-in,
    unless the real one is there already)."""
    table = getattr(multiprocessing.context, "_concrete_contexts", None)
    if not isinstance(table, dict):  # an interpreter whose multiprocessing keeps no such
        return  # table: the name stays unknown there, `fiberexec.multiprocessing` works
    if context is None:
        table.setdefault(NAME, _Deferred())
    else:
        table[NAME] = context
