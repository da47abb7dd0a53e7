"""Large buffers through shared memory: one copy in, zero copies out.

The sender writes a buffer into a file under ``/dev/shm`` and sends its name; the receiver maps
it and unlinks it at once, so the file lives only while a message is in flight. Names carry the
executor's id, so whatever a crash leaves behind is removed by `remove_all`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "fiberexec-"


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _path(name: str) -> Path:
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"not a fiberexec shared-memory name: {name!r}")
    return SHM_DIR / name


def write(executor_id: str, buffer: memoryview) -> str:
    """Copy ``buffer`` into a new shared-memory file and return its name."""
    name = f"{PREFIX}{executor_id}-{secrets.token_hex(8)}"
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        view = buffer.cast("B")
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
    finally:
        os.close(fd)
    return name


def take(name: str, size: int) -> memoryview:
    """Map the file ``name`` (read-write, private to us from now on) and unlink it."""
    path = _path(name)
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


def discard(name: str) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        os.unlink(_path(name))


def remove_all(executor_id: str) -> int:
    """Remove every file this executor's processes left behind; return how many."""
    count = 0
    for path in SHM_DIR.glob(f"{PREFIX}{executor_id}-*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            count += 1
    return count


def write_probe(executor_id: str, token: bytes) -> str:
    """A file whose content proves a peer shares our /dev/shm (see `check_probe`)."""
    return write(executor_id, memoryview(token))


def check_probe(name: str, token_size: int) -> bytes | None:
    """Read a probe without unlinking it; None when it is not visible from here."""
    try:
        with _path(name).open("rb") as f:
            return f.read(token_size + 1)
    except (OSError, ValueError):
        return None
