"""The parent's main module in a child process, as the stdlib's spawn gives (``sys.argv``
travels with the import path: `fiberexec._syspath`).

A function or class defined in the parent's main script is ``__main__.<name>`` to a pickle.
This module's own pickling sends such objects by value, but the standard library pickles
them by reference: a stdlib `queues.Queue` or `Connection` made with this module's context
(as `concurrent.futures.ProcessPoolExecutor` makes its call queue) carries ``__main__.f``.
A spawned stdlib child imports the parent's main script as ``__mp_main__`` to find it, and
so does a child here, on the first such lookup only (`_mainspace.install`'s fallback): a
child that never needs it never runs the script.

As in the stdlib, the script's module-level code then runs in the child, with a name that
is not ``"__main__"``; a script that starts processes outside an
``if __name__ == "__main__":`` block gets the stdlib's `RuntimeError` rather than starting
processes without end.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import types
from collections.abc import Mapping
from typing import Any

_info: dict[str, str] = {}  # in a child: the parent's `fiberexec._syspath.main_origin`
_lock = threading.RLock()
_loaded: types.ModuleType | None = None
_failed: str = ""
importing = False  # the parent's main module is being run here


def adopt(origin: Mapping[str, str]) -> None:
    """In a child: remember where the parent's main module is (it travels with the import
    path, `fiberexec._syspath`)."""
    global _info
    _info = dict(origin)


def lookup(name: str) -> Any:
    """``__main__.<name>`` of the parent, importing its main module on first need."""
    module = _load()
    if module is None:
        where = _info.get("path") or _info.get("name") or "an interactive session"
        why = f": {_failed}" if _failed else ""
        raise AttributeError(
            f"module '__main__' has no attribute {name!r}: it is defined in the parent's main "
            f"module ({where}), which could not be imported here{why}")
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module '__main__' has no attribute {name!r}") from None


def _load() -> types.ModuleType | None:
    global _loaded, _failed, importing
    with _lock:
        if _loaded is not None or _failed or importing:
            return _loaded
        name, path = _info.get("name"), _info.get("path")
        if isinstance(name, str) and not (name == "__main__" or name.endswith(".__main__")):
            path = None
        elif isinstance(path, str) and os.path.basename(path) != "ipython":
            if not os.path.exists(path):
                _failed = f"{path} is not on this host"
                return None
            name = None
        else:
            _failed = "the parent was not started from a script or module"
            return None
        importing = True
        try:
            namespace = (runpy.run_module(name, run_name="__mp_main__", alter_sys=True)
                         if name is not None
                         else runpy.run_path(str(path), run_name="__mp_main__"))
        except Exception as exc:  # reported with the attribute asked for
            _failed = f"{type(exc).__name__}: {exc}"
            return None
        finally:
            importing = False
        module = types.ModuleType("__mp_main__")
        module.__dict__.update(namespace)
        sys.modules["__mp_main__"] = _loaded = module
        return module


def check_not_importing() -> None:
    """Raise the stdlib's error for a process started while the main module is imported."""
    if importing:
        raise RuntimeError(
            "An attempt has been made to start a new process before the current process has "
            "finished its bootstrapping phase: the parent's main module, imported here to "
            "find one of its functions or classes, starts processes as it is imported. Put "
            "that code under 'if __name__ == \"__main__\":'.")
