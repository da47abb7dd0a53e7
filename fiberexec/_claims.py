"""Who runs a task a worker holds: a board in shared memory that the executor can read and
write without the worker's help.

A worker holds tasks sent to wait behind its running one. When that task runs much longer
than expected while another worker could run them, or a `cancel` wants one, the executor
takes them back. Asking over the link (`Revoke`) needs the worker to answer, and a task that
holds the GIL in C for seconds keeps every thread of its process from answering: the tasks
behind it waited for it while other workers sat idle, and `cancel` gave up. A worker on the
executor's host (one that shares its ``/dev/shm``) instead has a board both processes map,
guarded by a semaphore both open:

* both number the tasks sent to the worker (0, 1, 2, ... in the order sent and received);
* the worker, before starting one, records its number as decided, under the semaphore,
  and drops it unrun if its bit is set (the executor took it back);
* the executor takes back numbers above the last one decided, setting their bits under
  the semaphore, and knows at once which tasks are its own again, with no answer.

Bits are kept per number modulo `BITS` (a worker holds at most a thousand-odd tasks, so
numbers in flight never share a bit); the worker clears the bits of every number it passes
(decided, or given back over the link), so a bit is clear when its number comes round
again. The worker makes the board's page beside its handshake's probe (`fiberexec._protocol`);
the executor maps it on the worker's Hello and makes the semaphore, which the worker opens on
the Setup. The executor makes it because making a named semaphore is not atomic (glibc writes
a temporary ``/dev/shm/sem.XXXXXX`` and links it under its name): a worker killed inside that
call, which tests and users do, would leave the temporary file, named after nothing of ours.
Opening one leaves nothing. The executor unlinks the page's name once mapped, the worker the
semaphore's once open, and the executor both again when it loses the worker, so a crash
leaves nothing behind (and the executor's own files all go at its shutdown).
"""

from __future__ import annotations

import _multiprocessing  # type: ignore[import-not-found]  # (no stubs: the SemLock type)
import contextlib
import mmap
import os
import struct
from collections.abc import Iterable
from typing import Protocol, cast

from fiberexec import _shm

SUFFIX = "-claims"  # the board's name: the handshake's shared-memory probe's, and this
_DECIDED = struct.Struct("q")  # the last number the worker decided on (-1: none yet)
_BITMAP = 16  # where the bits start, one per number modulo BITS
BITS = (mmap.PAGESIZE - _BITMAP) * 8
_SEMAPHORE = 1  # `_multiprocessing.SemLock`'s kind for a plain semaphore
WAIT = 1.0  # seconds a worker waits for the semaphore before it looks at its link again


class _Semaphore(Protocol):  # what is used of `_multiprocessing.SemLock`
    def acquire(self, block: bool = True, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...


class ClaimBoard:
    """One worker's board; `create` and `open_lock` in the worker, `attach` in the executor."""

    def __init__(self, name: str, memory: mmap.mmap, lock: _Semaphore | None) -> None:
        self.name = name
        self._memory = memory
        self._lock = lock  # (the worker's: None until `open_lock`)
        self._linked = True

    @classmethod
    def create(cls, probe: str) -> ClaimBoard | None:
        """(Worker) A new board's page, named after the handshake's probe; None when there
        is no room. Its semaphore is the executor's to make (`attach`)."""
        name = probe + SUFFIX
        path = _shm.segment_path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            memory = mmap.mmap(fd, mmap.PAGESIZE)
        except OSError:
            os.unlink(path)
            return None
        finally:
            os.close(fd)
        _DECIDED.pack_into(memory, 0, -1)
        return cls(name, memory, None)

    def open_lock(self) -> bool:
        """(Worker) Open the semaphore the executor made for this board (it said so in the
        Setup); False if it cannot be opened."""
        try:
            self._lock = cast(_Semaphore, _multiprocessing.SemLock._rebuild(
                0, _SEMAPHORE, 1, "/" + self.name))
        except (OSError, ValueError):
            return False
        return True

    @classmethod
    def attach(cls, probe: str) -> ClaimBoard | None:
        """(Executor) Map the page the worker made beside its handshake's probe and make the
        board's semaphore; None if either fails here (then the worker is told not to use
        the board)."""
        name = probe + SUFFIX
        try:
            with open(_shm.segment_path(name), "r+b") as f:
                memory = mmap.mmap(f.fileno(), mmap.PAGESIZE)
        except (OSError, ValueError):
            return None
        try:
            lock = cast(_Semaphore, _multiprocessing.SemLock(_SEMAPHORE, 1, 1, "/" + name,
                                                             False))
        except OSError:  # (one of that name already: not made for this worker)
            memory.close()
            return None
        return cls(name, memory, lock)

    def unlink(self, *, semaphore: bool = True) -> None:
        """Remove the board's names: the page's, and the semaphore's unless told not to
        (the executor keeps it until the worker has opened it)."""
        if self._linked:
            self._linked = not semaphore
            unlink(self.name[: -len(SUFFIX)], semaphore=semaphore)

    def close(self) -> None:
        self.unlink()
        with contextlib.suppress(BufferError, ValueError):
            self._memory.close()

    def _bit(self, number: int) -> tuple[int, int]:
        place = number % BITS
        return _BITMAP + place // 8, 1 << (place % 8)

    # ------------------------------------------------------------ the worker

    def claim(self, number: int) -> bool | None:
        """(Worker) About to start task ``number``: True to run it, False if the executor
        took it back, None if the semaphore stayed taken for `WAIT` seconds (look at the
        link, then ask again: an executor that died holding it has hung up)."""
        memory, lock = self._memory, self._lock
        assert lock is not None, "claim before open_lock"
        if not lock.acquire(True, WAIT):
            return None
        try:
            (decided,) = _DECIDED.unpack_from(memory, 0)
            for passed in range(max(decided + 1, number - BITS + 1), number):
                at, bit = self._bit(passed)  # given back over the link: cleared for later
                memory[at] &= ~bit
            at, bit = self._bit(number)
            taken = bool(memory[at] & bit)
            memory[at] &= ~bit
            _DECIDED.pack_into(memory, 0, number)
        finally:
            lock.release()
        return not taken

    # ------------------------------------------------------------ the executor

    def take_back(self, numbers: Iterable[int]) -> set[int] | None:
        """(Executor) Take back the tasks of these numbers the worker has not decided on;
        returns their numbers (the others it started), or None when the semaphore is taken
        (ask later, or over the link)."""
        memory, lock = self._memory, self._lock
        assert lock is not None
        if not lock.acquire(False):
            return None
        try:
            (decided,) = _DECIDED.unpack_from(memory, 0)
            taken = {n for n in numbers if n > decided}
            for number in taken:
                at, bit = self._bit(number)
                memory[at] |= bit
        finally:
            lock.release()
        return taken


def unlink(probe: str, *, semaphore: bool = True) -> None:
    """Remove the names of the board beside ``probe`` that are there: its page's, and its
    semaphore's unless told not to."""
    name = probe + SUFFIX
    with contextlib.suppress(OSError, ValueError):
        os.unlink(_shm.segment_path(name))
    if semaphore:
        with contextlib.suppress(OSError):
            _multiprocessing.sem_unlink("/" + name)
