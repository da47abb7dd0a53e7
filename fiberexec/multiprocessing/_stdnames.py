"""The rest of a stdlib submodule's names, for ours of the same name.

Each of ``fiberexec.multiprocessing``'s submodules defines the names of its stdlib
namesake's ``__all__``, ours where the name is process-specific. Programs also use names
outside ``__all__`` (``multiprocessing.queues.Empty``, ``multiprocessing.util.DEBUG``,
``multiprocessing.context.SpawnContext``): those are the stdlib's, through the module's
``__getattr__`` made here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def fallback(ours: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``fiberexec.multiprocessing.<x>`` (``ours``): the stdlib
    ``multiprocessing.<x>``'s name, where this module does not define it."""
    stdlib_name = "multiprocessing." + ours.rsplit(".", 1)[1]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # (dunders are the module's own: `__path__`, `__file__`)
            raise AttributeError(f"module {ours!r} has no attribute {name!r}")
        try:
            return getattr(importlib.import_module(stdlib_name), name)
        except AttributeError:
            raise AttributeError(f"module {ours!r} has no attribute {name!r}") from None

    return __getattr__
