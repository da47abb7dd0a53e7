"""`multiprocessing.shared_memory.SharedMemory` attached in a child or worker of ours (this
module imports nothing of fiberexec: it runs while `multiprocessing.managers` may be half
imported).

On Python < 3.13 attaching a segment registers it with the attaching process's resource
tracker, which unlinks it when that process exits. A stdlib child shares its parent's
tracker, so nothing is lost; ours are fresh interpreters with trackers of their own, which
would destroy the parent's segment when the child ends. In our children, attaching
(``create=False``) therefore does not register; creating still does. Unlinking a segment
attached so does not unregister it either: the tracker never had it, and would print a
``KeyError`` traceback for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from typing import Any

_lock = threading.Lock()
_installed = False


def attach_without_tracking() -> None:
    """Install the attach-without-registering rule in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed or not hasattr(resource_tracker, "register"):
            return
        _installed = True
    original_init = shared_memory.SharedMemory.__init__
    original_unlink = shared_memory.SharedMemory.unlink

    def __init__(self: Any, name: str | None = None, create: bool = False,
                 size: int = 0, **kwargs: Any) -> None:
        if create:
            original_init(self, name, create, size, **kwargs)
            return
        with _untracked("register"):
            original_init(self, name, create, size, **kwargs)
        self._fiberexec_untracked = True

    def unlink(self: Any) -> None:
        if not getattr(self, "_fiberexec_untracked", False):
            original_unlink(self)
            return
        with _untracked("unregister"):
            original_unlink(self)

    shared_memory.SharedMemory.__init__ = __init__  # type: ignore[method-assign]
    shared_memory.SharedMemory.unlink = unlink  # type: ignore[method-assign]


@contextlib.contextmanager
def _untracked(call: str) -> Iterator[None]:
    """While inside: ``resource_tracker.<call>`` passes over shared memory segments."""
    with _lock:
        original = getattr(resource_tracker, call)

        def except_shared_memory(name: str, rtype: str) -> None:
            if rtype != "shared_memory":
                original(name, rtype)

        setattr(resource_tracker, call, except_shared_memory)
        try:
            yield
        finally:
            setattr(resource_tracker, call, original)
