"""Names in the kernel this process made (named semaphores, files in /dev/shm): each is
removed when its object is collected, at exit, or at once by `remove_all`, and only by the
process that made it (a forked child that exits normally runs the finalizers it inherited,
and must leave its parent's names alone). Meanwhile the standard library's resource
tracker holds it, and removes it if this process is killed."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

_owned: dict[str, weakref.finalize[Any, Any]] = {}  # by name, every kind


def own(obj: object, name: str, remove: Callable[[str], None],
        tracker: tuple[str, str] | None) -> None:
    """Remove ``name`` with ``remove`` once ``obj`` is collected. ``tracker`` is the name and
    kind the resource tracker knows it by (None: it cannot remove this kind)."""
    tracked = tracker is not None and _register(*tracker)
    _owned[name] = weakref.finalize(obj, _remove, name, remove,
                                    tracker if tracked else None, os.getpid())


def remove_all() -> None:
    """Remove this process's names now (it exits without running its finalizers, as a
    `Process` child does: its resource tracker would remove them, and warn of each as
    leaked)."""
    for finalizer in list(_owned.values()):
        finalizer()


def _register(name: str, kind: str) -> bool:
    from multiprocessing import resource_tracker

    try:
        resource_tracker.register(name, kind)
    except OSError:  # no tracker could start: the name goes when dropped, as before
        return False
    return True


def _remove(name: str, remove: Callable[[str], None], tracker: tuple[str, str] | None,
            creator: int) -> None:
    if os.getpid() != creator:
        return
    _owned.pop(name, None)
    with contextlib.suppress(OSError):
        remove(name)
    if tracker is not None:
        from multiprocessing import resource_tracker

        with contextlib.suppress(OSError):
            resource_tracker.unregister(*tracker)
