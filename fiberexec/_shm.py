"""Large buffers through shared memory: one copy in, zero copies out.

The sender writes a buffer into a file under ``/dev/shm`` and sends its name; the receiver maps
it, and the buffer it hands on (a numpy array, say) is that mapping. Names carry the
executor's id, so whatever a crash leaves behind is removed by `remove_all`.

Pages, not copies, are what large buffers cost here: filling a new 10 MiB file takes the
kernel 6.5 ms of page allocation, and freeing it 3.6 ms more, against 2.7 ms to copy into
pages that exist. So a sender keeps a few files (`Segment`, at most `POOL_SEGMENTS` and
`POOL_BYTES` per process) and writes each buffer into one that is free. Its first page is a
flag: the sender sets it when it writes; the receiver clears it once its mapping is gone (a
finalizer on the mapping, so a buffer the receiver keeps keeps the file busy), and the file
is then written again. When none is free, a buffer goes into a file of its own, which the
receiver unlinks as it maps it (as does a buffer the receiver keeps for good: `write`'s
``keep``). A process drops its files when it is done (`drop_pool`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
import weakref
from typing import NamedTuple

log = logging.getLogger("fiberexec")

SHM_DIR = "/dev/shm"
PREFIX = "fiberexec-"
POOL_TAG = "-pool-"  # in the names of files a sender writes again
FLAG = mmap.PAGESIZE  # the flag page before a pooled file's data
POOL_SEGMENTS = 4  # files one process keeps per executor
POOL_BYTES = 256 << 20  # ...holding at most this much
COPY_CHUNK = 4 << 20  # bytes copied into a pooled file while holding the interpreter's lock


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def segment_path(name: str) -> str:
    """The file under `SHM_DIR` of the segment ``name`` (one of fiberexec's names only)."""
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"not a fiberexec shared-memory name: {name!r}")
    return os.path.join(SHM_DIR, name)


def write(executor_id: str, buffer: memoryview, *, keep: bool = False) -> str | None:
    """Copy ``buffer`` into shared memory and return the file's name: a free file of this
    process's pool, else (or when the receiver will ``keep`` it) a new file of its own.
    None when shared memory has no room for it (nothing of it is left there): the caller
    sends the bytes another way."""
    view = buffer.cast("B")
    try:
        if not keep:
            pool = _pools.get(executor_id)
            segment = pool.claim(len(view))
            if segment is not None:
                try:
                    segment.write(view)
                except OSError:
                    pool.remove(segment)  # its pages go back: a later buffer may fit
                    raise
                return segment.name
        if not _room_for(len(view)):
            return None
        name = f"{PREFIX}{executor_id}-{os.urandom(8).hex()}"
        fd = os.open(segment_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            write_all(fd, view, 0)
        except OSError:
            os.unlink(segment_path(name))
            raise
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        _no_room(len(view))
        return None
    return name


_NO_ROOM = (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT, errno.EFBIG)
_said_no_room = False  # the warning is given once per process


def _room_for(size: int) -> bool:
    """Whether /dev/shm has ``size`` bytes free (`_no_room` says so when it has not)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return True  # no figures: the write will tell
    if stat.f_bavail * stat.f_frsize >= size:
        return True
    _no_room(size, stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize)
    return False


def _no_room(size: int, free: int | None = None, total: int | None = None) -> None:
    global _said_no_room
    if _said_no_room:
        return
    _said_no_room = True
    room = "" if free is None or total is None else (
        f" ({free / 2**20:.1f} MiB free of {total / 2**20:.1f} MiB)")
    log.warning(
        "shared memory (%s) has no room for a %.1f MiB buffer%s: large arguments and results "
        "that do not fit go through the connection instead, which is slower. Give %s more "
        "room: in Docker, `docker run --shm-size=2g`; in Kubernetes, an emptyDir volume with "
        "medium: Memory mounted there", SHM_DIR, size / 2**20, room, SHM_DIR)


def write_all(fd: int, view: memoryview, offset: int) -> None:
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], offset + written)


def take(name: str, size: int) -> memoryview:
    """Map the file ``name``: a pooled file until the mapping is gone (then it is free for
    its sender again), any other private to us from now on (it is unlinked)."""
    if POOL_TAG in name:
        return _take_pooled(name, size)
    path = segment_path(name)
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != size:
            raise ValueError(f"shared-memory file {name} has the wrong size")
        mapped = mmap.mmap(fd, size) if size else mmap.mmap(-1, 1)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return memoryview(mapped)[:size]


def _take_pooled(name: str, size: int) -> memoryview:
    path = segment_path(name)
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size < FLAG + size:
            raise ValueError(f"shared-memory file {name} is too small")
        mapped = mmap.mmap(fd, size, offset=FLAG)
    finally:
        os.close(fd)
    weakref.finalize(mapped, _free, path, os.getpid())
    return memoryview(mapped)[:size]


def _free(path: str, pid: int) -> None:
    """The receiver's mapping of a pooled file is gone: its sender may write it again.
    (Not by a forked child's copy, at its exit: the parent's mapping lives on.)"""
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\0", 0)
        finally:
            os.close(fd)


def discard(name: str) -> None:
    """A file a message carried, which its receiver may not have taken: remove it (a pooled
    one stays, for its sender to write again once free)."""
    if POOL_TAG in name:
        return
    with contextlib.suppress(FileNotFoundError, ValueError):
        os.unlink(segment_path(name))


def drop_pool(executor_id: str | None = None) -> None:
    """Unlink this process's pooled files (of one executor, or all); a receiver's mapping
    outlives it."""
    _pools.drop(executor_id)


class Segment(NamedTuple):
    """A pooled file, its pages allocated when it is made and mapped here for good: a
    buffer is copied in with ``memcpy`` (10 MiB: 0.7 ms here, against 1.2-2.5 ms for
    ``pwrite``, which finds and locks each page in the kernel), and a copy never allocates
    a page, so a full /dev/shm cannot fault the writer (a write through a mapping has no
    error to return, only SIGBUS)."""

    name: str
    fd: int
    capacity: int
    mapping: mmap.mmap | None  # None where pages cannot be allocated ahead: ``pwrite``

    def write(self, view: memoryview) -> None:
        if self.mapping is None:
            write_all(self.fd, view, FLAG)
            return
        for start in range(0, len(view), COPY_CHUNK):  # other threads run between chunks
            chunk = view[start:start + COPY_CHUNK]
            self.mapping[FLAG + start:FLAG + start + len(chunk)] = chunk

    def close(self) -> None:
        if self.mapping is not None:
            self.mapping.close()
        os.close(self.fd)


def _allocated(fd: int, size: int) -> bool:
    """Allocate the file's pages now; False where that cannot be done ahead (the file
    system or the OS has no such call). OSError when there is no room."""
    if not hasattr(os, "posix_fallocate"):
        return False
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    return True


class _Pool:
    """One process's files for one executor."""

    def __init__(self, executor_id: str) -> None:
        self.executor_id = executor_id
        self.segments: list[Segment] = []
        self.lock = threading.Lock()  # shard threads, or a worker's two senders

    def claim(self, size: int) -> Segment | None:
        """A free file of at least ``size`` bytes, marked busy; None when there is none and
        the pool may not grow, or shared memory has no room for another (OSError when that
        is found only as the file is made)."""
        with self.lock:
            for segment in self.segments:
                if segment.capacity >= size and os.pread(segment.fd, 1, 0) == b"\0":
                    os.pwrite(segment.fd, b"\1", 0)
                    return segment
            capacity = -(-size // (1 << 20)) << 20  # whole MiB: near sizes share a file
            held = sum(s.capacity for s in self.segments)
            if (len(self.segments) >= POOL_SEGMENTS or held + capacity > POOL_BYTES
                    or not _room_for(FLAG + capacity)):  # (its pages come as it is made)
                return None
            name = (f"{PREFIX}{self.executor_id}{POOL_TAG}{os.getpid()}-"
                    f"{os.urandom(4).hex()}")
            fd = os.open(segment_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC,
                         0o600)
            mapping = None
            try:
                os.ftruncate(fd, FLAG + capacity)
                if _allocated(fd, FLAG + capacity):
                    mapping = mmap.mmap(fd, FLAG + capacity)
                os.pwrite(fd, b"\1", 0)
            except OSError:  # no room (`write` says so)
                os.close(fd)
                os.unlink(segment_path(name))
                raise
            segment = Segment(name, fd, capacity, mapping)
            self.segments.append(segment)
            return segment

    def remove(self, segment: Segment) -> None:
        """Unlink a file whose write failed (it was marked busy: no one maps it)."""
        with self.lock:
            self.segments.remove(segment)
        segment.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(segment_path(segment.name))

    def drop(self) -> None:
        with self.lock:
            segments, self.segments = self.segments, []
        for segment in segments:
            segment.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(segment_path(segment.name))


class _Pools:
    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def get(self, executor_id: str) -> _Pool:
        with self._lock:
            if os.getpid() != self._pid:  # a forked child: its parent's files are not its own
                self._pools, self._pid = {}, os.getpid()
            pool = self._pools.get(executor_id)
            if pool is None:
                pool = self._pools[executor_id] = _Pool(executor_id)
            return pool

    def drop(self, executor_id: str | None) -> None:
        with self._lock:
            if os.getpid() != self._pid:
                self._pools, self._pid = {}, os.getpid()
            ids = list(self._pools) if executor_id is None else [executor_id]
            pools = [p for i in ids if (p := self._pools.pop(i, None)) is not None]
        for pool in pools:
            pool.drop()


_pools = _Pools()


def remove_all(executor_id: str) -> int:
    """Remove every file this executor's processes left behind (and the semaphores of claim
    boards, `fiberexec._claims`); return how many."""
    count = 0
    ours = f"{PREFIX}{executor_id}-"
    try:
        names = os.listdir(SHM_DIR)
    except OSError:  # no /dev/shm here (nothing was written there, then)
        return 0
    for name in names:
        if name.startswith((ours, "sem." + ours)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))
                count += 1
    return count


def write_probe(executor_id: str, token: bytes) -> str:
    """(Worker) A file whose content proves to the executor that the two share /dev/shm
    (see `check_probe`); "" when there is no room for it (then nothing goes through shared
    memory)."""
    return write(executor_id, memoryview(token), keep=True) or ""  # a file of its own


def check_probe(name: str, token_size: int) -> tuple[bytes, int] | None:
    """(Executor) A probe's content (up to one byte more than ``token_size``) and the user
    id that owns it, without unlinking it; None when it is not visible from here."""
    try:
        with open(segment_path(name), "rb") as f:
            return f.read(token_size + 1), os.fstat(f.fileno()).st_uid
    except (OSError, ValueError):
        return None
