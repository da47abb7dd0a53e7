"""`SharedMemoryManager`: shared memory segments freed when their manager shuts down.

As the stdlib's: ``SharedMemory(size)`` and ``ShareableList(sequence)`` create a segment in
the calling process and tell the manager's server its name; when the server shuts down
(``shutdown()``, the end of a ``with`` block, the manager collected or the program's exit),
it unlinks every segment it was told of. Segments live in this host's ``/dev/shm``, so the
server runs on this host: on the ``local`` backend unless told otherwise (the stdlib's
server is a local process too). Other processes attach the segments on this host only.

The creating process hands the segment's unlinking to the server: it takes the segment off
its own `resource_tracker` (the stdlib's server shares its parent's tracker; ours is a
fresh interpreter with its own), so neither unlinks twice or warns of a leak.
"""

from __future__ import annotations

from collections.abc import Iterable
from multiprocessing import resource_tracker, shared_memory, util
from typing import Any

from fiberexec.multiprocessing._managers import BaseManager


class _Segments:
    """In the server: the names of the segments to unlink when it ends."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        util.Finalize(self, _unlink_all, args=(self._names,), exitpriority=10)

    def track(self, name: str) -> None:
        self._names.add(name)

    def names(self) -> list[str]:
        return sorted(self._names)


def _unlink_all(names: set[str]) -> None:
    for name in sorted(names):
        try:
            segment = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue  # unlinked already, by its user
        segment.close()
        segment.unlink()
    names.clear()


class SharedMemoryManager(BaseManager):
    """``multiprocessing.managers.SharedMemoryManager``: a manager whose server unlinks the
    segments made through it when it shuts down.

    Args are `BaseManager`'s; ``backend`` defaults to ``"local"`` (see the module).
    """

    def __init__(self, *args: Any, backend: Any = "local", **kwargs: Any) -> None:
        super().__init__(*args, backend=backend, **kwargs)
        self._segments: Any = None  # the server's `_Segments`, once started

    def start(self, initializer: Any = None, initargs: tuple[Any, ...] = ()) -> None:
        super().start(initializer, initargs)
        self._segments = self._create("_Segments")

    def _track(self, segment: shared_memory.SharedMemory) -> None:
        try:
            self._segments.track(segment.name)
        except BaseException:
            segment.close()
            segment.unlink()
            raise
        # the server unlinks it now, not this process's tracker (see the module)
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]

    def SharedMemory(self, size: int) -> shared_memory.SharedMemory:
        """A new segment of ``size`` bytes, unlinked when this manager shuts down."""
        self._check_started()
        segment = shared_memory.SharedMemory(None, create=True, size=size)
        self._track(segment)
        return segment

    def ShareableList(self, sequence: Iterable[Any] | None) -> shared_memory.ShareableList[Any]:
        """A new `ShareableList` of ``sequence``, unlinked when this manager shuts down."""
        self._check_started()
        shared = shared_memory.ShareableList(sequence)
        self._track(shared.shm)
        return shared

    def _check_started(self) -> None:
        if self._segments is None:
            raise ValueError(
                "SharedMemoryManager has not been started: call start() or use it in a "
                "'with' block before SharedMemory() or ShareableList()")


SharedMemoryManager.register("_Segments", _Segments, create_method=False)
