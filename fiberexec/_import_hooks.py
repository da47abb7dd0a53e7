"""In a worker: what must happen when a module is first imported, by whatever imports it.

* ``joblib``: its ``"fiber"`` backend is registered. A task defined in the user's script
  travels by value, without the script's own imports, so ``import fiberexec.joblib`` at
  the top of the script never runs in a worker, and a nested ``Parallel(backend="fiber")``
  there (which runs on threads: `fiberexec.joblib.in_worker`) would find no such backend.
* ``multiprocessing.shared_memory``: a segment attached by name is not registered with
  this process's resource tracker, which would unlink the parent's segment when the
  worker ends (`fiberexec._untracked_shm`).

Each is done at once if its module is already loaded (a forked worker's launcher had it),
else by a finder that watches for the import: neither module is imported for nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec


def _register_joblib() -> None:
    try:
        import fiberexec.joblib  # noqa: F401  # registers the backend
    except Exception:  # joblib too old or broken: its own error shows at use
        pass


def _attach_untracked() -> None:
    from fiberexec import _untracked_shm

    _untracked_shm.attach_without_tracking()


WATCHED: dict[str, Callable[[], None]] = {
    "joblib": _register_joblib,
    "multiprocessing.shared_memory": _attach_untracked,
}


def install() -> None:
    """Do each module's part now if it is loaded, else once it is imported."""
    pending = set()
    for name, then in WATCHED.items():
        if name in sys.modules:
            then()
        else:
            pending.add(name)
    if pending and not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(pending))


class _Finder:
    """A meta path finder (not derived from `importlib.abc.MetaPathFinder`, whose import
    costs a fresh worker 7 ms) that finds nothing itself: it lets the other finders find a
    watched module, and wraps its loading."""

    def __init__(self, pending: set[str]) -> None:
        self.pending = pending

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)  # watched once (and no recursion from here)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, then = loader.exec_module, WATCHED[fullname]

        def exec_module(module: ModuleType) -> None:
            run(module)
            then()

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's loader
        return spec
