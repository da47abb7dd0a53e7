"""Who runs a task a worker holds: a board in shared memory that the executor can read and
write without the worker's help.

A worker holds tasks sent to wait behind its running one. When that task runs much longer
than expected while another worker idles, the executor takes the waiting ones back. Asking
over the link (`Revoke`) needs the worker to answer, and a task that holds the GIL in C for
seconds keeps every thread of its process from answering: the tasks behind it waited for it
while other workers sat idle. A worker on the executor's host (one that shares its
``/dev/shm``) instead has a board both processes map, guarded by a semaphore both open:

* the worker numbers the tasks it receives (0, 1, 2, ... in arrival order, as the executor
  numbers them as it sends) and, before starting one, records its number as decided and
  checks it against the range the executor took back: a task in it is dropped, unrun;
* the executor takes back a range of numbers after the last one the worker decided on, and
  knows at once which tasks are its own again, with no answer from the worker.

The semaphore makes the worker's check-and-record and the executor's read-and-cut one step
each, so no task is ever both taken back and run. A new cut waits until the worker has
passed the last one (decided a number at or past its end); until then the executor asks
over the link, as it does for workers elsewhere.

Both names are unlinked as soon as the worker has opened them (the handshake's end), so a
crash leaves nothing behind.
"""

from __future__ import annotations

import _multiprocessing  # type: ignore[import-not-found]  # (no stubs: the SemLock type)
import contextlib
import mmap
import os
import struct
from typing import Protocol, cast

from fiberexec import _shm

SUFFIX = "-claims"  # the board's name: the handshake's shared-memory probe's, and this
_LAYOUT = struct.Struct("qqq")  # decided (the worker), lo and hi of the cut (the executor)
_SEMAPHORE = 1  # `_multiprocessing.SemLock`'s kind for a plain semaphore
WAIT = 1.0  # seconds a worker waits for the semaphore before it looks at its link again


class _Semaphore(Protocol):  # what is used of `_multiprocessing.SemLock`
    def acquire(self, block: bool = True, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...


class ClaimBoard:
    """One worker's board; `create` in the executor, `attach` in the worker."""

    def __init__(self, name: str, memory: mmap.mmap, lock: _Semaphore) -> None:
        self.name = name
        self._memory = memory
        self._lock = lock
        self._linked = True

    @classmethod
    def create(cls, probe: str) -> ClaimBoard | None:
        """A new board named after the handshake's probe; None when there is no room."""
        name = probe + SUFFIX
        path = _shm._path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            memory = mmap.mmap(fd, mmap.PAGESIZE)
        except OSError:
            os.close(fd)
            os.unlink(path)
            return None
        os.close(fd)
        _LAYOUT.pack_into(memory, 0, -1, 0, 0)
        try:
            lock = cast(_Semaphore, _multiprocessing.SemLock(_SEMAPHORE, 1, 1, "/" + name,
                                                             False))
        except OSError:
            memory.close()
            os.unlink(path)
            return None
        return cls(name, memory, lock)

    @classmethod
    def attach(cls, probe: str) -> ClaimBoard | None:
        """The board the executor made for this handshake; None if there is none."""
        name = probe + SUFFIX
        try:
            with open(_shm._path(name), "r+b") as f:
                memory = mmap.mmap(f.fileno(), mmap.PAGESIZE)
            lock = cast(_Semaphore,
                        _multiprocessing.SemLock._rebuild(0, _SEMAPHORE, 1, "/" + name))
        except (OSError, ValueError):
            return None
        board = cls(name, memory, lock)
        board._linked = False  # the executor's to unlink
        return board

    def unlink(self) -> None:
        """Remove both names (the worker has them open, or never will)."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(OSError, ValueError):
                os.unlink(_shm._path(self.name))
            with contextlib.suppress(OSError):
                _multiprocessing.sem_unlink("/" + self.name)

    def close(self) -> None:
        self.unlink()
        with contextlib.suppress(BufferError, ValueError):
            self._memory.close()

    # ------------------------------------------------------------ the worker

    def claim(self, number: int) -> bool | None:
        """(Worker) About to start task ``number``: True to run it, False if the executor
        took it back, None if the semaphore stayed taken for `WAIT` seconds (look at the
        link, then ask again: an executor that died holding it has hung up)."""
        if not self._lock.acquire(True, WAIT):
            return None
        try:
            _, lo, hi = _LAYOUT.unpack_from(self._memory, 0)
            _LAYOUT.pack_into(self._memory, 0, number, lo, hi)
        finally:
            self._lock.release()
        return not lo <= number < hi

    # ------------------------------------------------------------ the executor

    def cut(self, first: int, end: int) -> int | None:
        """(Executor) Take back the tasks numbered ``first`` to ``end`` (excluded) that the
        worker has not decided on. Returns the first number taken back (``end`` when all
        had been decided), or None when it cannot tell now: the semaphore is taken, or the
        worker has not passed the last cut yet."""
        if not self._lock.acquire(False):
            return None
        try:
            decided, _, last_end = (int(v) for v in _LAYOUT.unpack_from(self._memory, 0))
            if decided < last_end - 1:
                return None
            start = max(first, decided + 1)
            if start < end:
                _LAYOUT.pack_into(self._memory, 0, decided, start, end)
            return min(start, end)
        finally:
            self._lock.release()
