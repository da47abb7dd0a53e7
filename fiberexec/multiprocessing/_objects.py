"""Objects a server holds for other processes, counted by the handles that refer to them.

Both object servers of the multiprocessing layer keep their objects here: a process's broker
(`Lock`, `Event`, `Condition` and the rest of `_sync`) and a manager's server (`_managers`).
As the standard library's managers count proxies, creating an object gives it its first
reference (the handle made for it), unpickling a handle adds one (``incref``), and a handle
garbage collected, or held by a process that ends, releases its own (``decref``, sent in
batches by `_proxies`' releaser). The last release frees the object, outside the table's
lock: freeing it may release handles it held, whose releases come back here.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any


class ObjectTable:
    """Objects by id, each with its kind and its count of live handles; thread-safe.

    ``owner`` and ``handle`` name the server and its handles in the error for an id that is
    gone (``"manager"``, ``"proxy"``)."""

    def __init__(self, owner: str, handle: str) -> None:
        self.owner, self.handle = owner, handle
        self._objects: dict[int, tuple[Any, str]] = {}
        self._refs: dict[int, int] = {}
        self._ids = itertools.count(1)
        # re-entrant: freeing an object may free handles it held, whose releases come here
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._objects)

    def add(self, obj: Any, kind: str) -> int:
        """Keep ``obj``; the handle made for it holds its first reference."""
        with self._lock:
            oid = next(self._ids)
            self._objects[oid] = (obj, kind)
            self._refs[oid] = 1
        return oid

    def get(self, oid: int) -> tuple[Any, str]:
        """The object ``oid`` and its kind; `ReferenceError` if it was freed."""
        try:
            return self._objects[oid]
        except KeyError:
            raise ReferenceError(
                f"the {self.owner} holds no object {oid}: it was freed when the last "
                f"{self.handle} to it was dropped; keep a {self.handle} alive while other "
                "processes may still receive copies of it") from None

    def incref(self, oid: int) -> None:
        with self._lock:
            self.get(oid)
            self._refs[oid] += 1

    def decref(self, oids: list[int]) -> None:
        freed = []
        with self._lock:
            for oid in oids:
                left = self._refs.get(oid, 0) - 1
                if left > 0:
                    self._refs[oid] = left
                elif oid in self._refs:
                    del self._refs[oid]
                    freed.append(self._objects.pop(oid))
        freed.clear()  # the objects go here, outside the lock

    def debug_info(self) -> str:
        with self._lock:
            return "".join(f"  {oid}: refcount={self._refs[oid]}\n    {str(obj)[:75]}\n"
                           for oid, (obj, _) in sorted(self._objects.items()))
