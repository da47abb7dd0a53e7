"""`multiprocessing.shared_memory.SharedMemory` attached in a child of ours.

On Python < 3.13 attaching a segment registers it with the attaching process's resource
tracker, which unlinks it when that process exits. A stdlib child shares its parent's
tracker, so nothing is lost; ours are fresh interpreters with trackers of their own, which
would destroy the parent's segment when the child ends. In our children, attaching
(``create=False``) therefore does not register; creating still does.
"""

from __future__ import annotations

import threading
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
    original = shared_memory.SharedMemory.__init__

    def __init__(self: Any, name: str | None = None, create: bool = False,
                 size: int = 0, **kwargs: Any) -> None:
        if create:
            original(self, name, create, size, **kwargs)
            return
        with _lock:
            register = resource_tracker.register
            resource_tracker.register = _register_except_shared_memory(register)
            try:
                original(self, name, create, size, **kwargs)
            finally:
                resource_tracker.register = register

    shared_memory.SharedMemory.__init__ = __init__  # type: ignore[method-assign]


def _register_except_shared_memory(register: Any) -> Any:
    def maybe_register(name: str, rtype: str) -> None:
        if rtype != "shared_memory":
            register(name, rtype)

    return maybe_register
