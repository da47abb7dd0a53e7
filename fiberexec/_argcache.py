"""Large arguments sent once per worker: a content-keyed cache the executor mirrors.

An out-of-band buffer of at least `THRESHOLD` bytes in a task's arguments (a parameter
vector, a noise table) is keyed by its SHA-256. The first time a worker is sent it, the buffer
travels as usual, marked *keep*; after that only its key travels (*ref*). The worker keeps
what it is told to keep in a `Store`; the executor's `Mirror` of that store applies the same
operations in the same order (a worker decodes frames in the order they were encoded), so the
executor knows, without asking, what each worker holds::

    executor: _Writer._buffer  --Mirror.note(key)-->  miss: KEEP key + buffer
                                                      hit:  REF key
    worker:   _Reader._buffer  --Store.keep / Store.take-->  the task's own writable copy

Both sides evict by one rule (`_Entries`): when a new entry is kept, entries that no task used
among the worker's last `STALE_AFTER` tasks go, and then the least recently used go until the
total fits the capacity. An ES loop whose parameter vector changes each generation so holds
about two vectors per worker, not a capacity's worth of old ones.

A task always gets its own copy of a kept buffer, so a task that changes an argument in place
changes nothing another task sees, as with the standard library's fresh copy per task. Keys
are content digests, taken at each dispatch: a buffer changed between two tasks is a new key,
and nothing stale is ever served. The executor keeps a copy of buffers it hashed twice
(`_Recent`, 64 MiB at most): a buffer equal to one of them byte for byte takes that one's key
without hashing again.
"""

from __future__ import annotations

import collections
import hashlib
import mmap
import os
import threading

from fiberexec import _shm

THRESHOLD = 1 << 20  # smaller buffers cost less to send than to hash
KEY_SIZE = 32
STALE_AFTER = 8  # tasks without a use after which an entry goes when another is kept


def digest(view: memoryview) -> bytes:
    """The key of a buffer's content."""
    return _recent.digest(view)


class _Recent:
    """The last key hashed for each buffer size, and a copy of a buffer seen twice.

    An ES loop sends the same parameter vector in every dispatch of a generation: comparing
    it with the copy kept (a ``memcmp``: 1.4 ms for 10 MiB here) costs a fifth of hashing it
    again (SHA-256: 7 ms), and a buffer changed in place differs from the copy, so it is
    hashed afresh: the key is always the content's. A copy is made only once a size's hash
    repeats its last key: a program that sends a new buffer in every task (never the same
    twice) pays the hash and no copy (2.7 ms for 10 MiB).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget  # bytes of copies kept, at most
        self._keys: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._copies: collections.OrderedDict[int, bytearray] = collections.OrderedDict()
        self._lock = threading.Lock()  # several shards encode at once

    def digest(self, view: memoryview) -> bytes:
        size = view.nbytes
        if size > self.budget:
            return hashlib.sha256(view).digest()
        with self._lock:
            copy = self._copies.get(size)
            if copy is not None and copy == view:
                self._copies.move_to_end(size)
                return self._keys[size]
            key = hashlib.sha256(view).digest()
            repeated = self._keys.get(size) == key
            self._keys[size] = key
            self._keys.move_to_end(size)
            while len(self._keys) > KEYS_KEPT:
                self._keys.popitem(last=False)
            if not repeated:
                self._copies.pop(size, None)  # it holds other content: no use any more
                return key
            self._copies[size] = bytearray(view.cast("B"))
            while sum(map(len, self._copies.values())) > self.budget:
                self._copies.popitem(last=False)
            return key


KEYS_KEPT = 64  # buffer sizes whose last key `_Recent` remembers


_recent = _Recent(budget=64 << 20)


class _Entries:
    """Sizes and last uses by key, in use order: the eviction rule both sides share."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tick = 0  # tasks seen
        self.last: collections.OrderedDict[bytes, tuple[int, int]] = collections.OrderedDict()
        self.used = 0

    def next_task(self) -> None:
        self.tick += 1

    def fits(self, size: int) -> bool:
        return 0 < size <= self.capacity

    def touch(self, key: bytes) -> bool:
        """Note a use of ``key``; whether it is held."""
        entry = self.last.get(key)
        if entry is None:
            return False
        self.last[key] = (entry[0], self.tick)
        self.last.move_to_end(key)
        return True

    def add(self, key: bytes, size: int) -> list[bytes]:
        """Hold ``key``; return the keys evicted to make room."""
        gone = [k for k, (_, last) in self.last.items() if last < self.tick - STALE_AFTER]
        while self.used + size > self.capacity and len(gone) < len(self.last):
            oldest = next(k for k in self.last if k not in gone)
            gone.append(oldest)
        for key_gone in gone:
            self.used -= self.last.pop(key_gone)[0]
        self.last[key] = (size, self.tick)
        self.used += size
        return gone


class Tally:
    """Bytes of large arguments a shard sent to be kept, and bytes it did not send."""

    def __init__(self) -> None:
        self.kept = 0
        self.saved = 0


class Mirror:
    """What one worker holds, as the executor knows it (owned by the worker's shard)."""

    def __init__(self, capacity: int, tally: Tally | None = None, *,
                 threshold: int = THRESHOLD) -> None:
        self._entries = _Entries(capacity)
        self.tally = tally or Tally()
        self.threshold = threshold

    @property
    def keys(self) -> list[bytes]:
        """The keys the worker holds, least recently used first."""
        return list(self._entries.last)

    def next_task(self) -> None:
        self._entries.next_task()

    def cacheable(self, size: int) -> bool:
        return size >= self.threshold and self._entries.fits(size)

    def note(self, key: bytes, size: int) -> bool:
        """Record that a task needs ``key``; whether the worker holds it already (send a
        reference) or not (send the buffer, to be kept)."""
        entries = self._entries
        if entries.touch(key):
            self.tally.saved += size
            return True
        entries.add(key, size)
        self.tally.kept += size
        return False


class Store:
    """The buffers one worker keeps, evicted by the same rule as the executor's `Mirror`."""

    def __init__(self, capacity: int) -> None:
        self._entries = _Entries(capacity)
        self._buffers: dict[bytes, _Kept] = {}

    def next_task(self) -> None:
        self._entries.next_task()

    def keep(self, key: bytes, buffer: memoryview) -> memoryview:
        """Keep a copy of ``buffer`` under ``key``; return the task's own: ``buffer``, which
        the caller hands over (it maps a file nobody else does, or it is new memory)."""
        for gone in self._entries.add(key, buffer.nbytes):
            self._buffers.pop(gone).close()
        kept = self._buffers[key] = _Kept(buffer)
        return buffer if kept.in_file else memoryview(bytearray(buffer))

    def take(self, key: bytes) -> memoryview | None:
        """A fresh copy of the buffer kept under ``key``, or None if it is not held."""
        if not self._entries.touch(key):
            return None
        return self._buffers[key].copy()

    @property
    def keys(self) -> list[bytes]:
        """The keys held, least recently used first."""
        return list(self._entries.last)


class _Kept:
    """One kept buffer, in a memory file where the OS has them (Linux). Each task's copy is
    a private mapping of the file: no page is copied until the task writes it, and a write
    stays the task's. A copy into new memory costs a page fault a page (10 MiB: 3-5 ms
    here, most of a local 10 MiB argument's time); a mapping, tens of microseconds. Without
    memory files (or room for one), it is kept as it came, and each copy is made whole."""

    def __init__(self, buffer: memoryview) -> None:
        self.size = buffer.nbytes
        self._fd = -1
        self._buffer: memoryview | None = None
        if not self.size:
            self._buffer = buffer
            return
        try:
            fd = os.memfd_create("fiberexec-kept-argument", os.MFD_CLOEXEC)
        except (AttributeError, OSError):  # no memory files here (or too many open)
            self._buffer = buffer
            return
        try:
            os.ftruncate(fd, self.size)
            _shm.write_all(fd, buffer.cast("B"), 0)
        except OSError:  # no room for it there: keep the buffer itself
            os.close(fd)
            self._buffer = buffer
            return
        self._fd = fd

    @property
    def in_file(self) -> bool:
        return self._fd >= 0

    def copy(self) -> memoryview:
        if self._buffer is not None:
            return memoryview(bytearray(self._buffer))
        mapped = mmap.mmap(self._fd, self.size, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return memoryview(mapped)

    def close(self) -> None:
        """Evicted: the file goes once the last task's mapping of it does."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        elif self._buffer is not None:
            self._buffer.release()

