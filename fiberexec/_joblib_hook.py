"""In a worker: joblib's ``"fiber"`` backend exists as soon as joblib does.

A task defined in the user's script travels by value, without the script's own imports, so
``import fiberexec.joblib`` at the top of the script never runs in a worker, and a nested
``Parallel(backend="fiber")`` there (which runs on threads: `fiberexec.joblib.in_worker`)
would find no such backend. The worker registers it when joblib is first imported, by
whatever imports it (unpickling a task that names ``Parallel``, or the task's own body).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

WATCHED = "joblib"


def install() -> None:
    """Register ``"fiber"`` with joblib now if it is loaded, else once it is imported."""
    if WATCHED in sys.modules:
        _register()
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _register() -> None:
    try:
        import fiberexec.joblib  # noqa: F401  # registers the backend
    except Exception:  # joblib too old or broken: its own error shows at use
        pass


class _Finder:
    """A meta path finder (not derived from `importlib.abc.MetaPathFinder`, whose import
    costs a fresh worker 7 ms) that finds nothing itself: it lets the other finders find
    joblib, and wraps its loading."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != WATCHED:
            return None
        sys.meta_path.remove(self)  # one import of joblib to watch, and no recursion here
        spec = importlib.util.find_spec(fullname)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _register()

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's loader
        return spec
