"""How many queue items a consumer took, in memory its broker reads: no message per item.

A process consuming queues of another process's broker counts each item it takes in a page
of shared memory (a ``memfd``) before the item is returned; the broker maps the same page
and reads the count whenever it needs it: to know how many items sent ahead may be
replaced, to answer ``qsize()``, and, when the consumer's process ends, to put back exactly
the items it had not taken. So a consumer that keeps up reports what it takes only now and
then (see `_stream.Stream._take`), and an item is still never handed out twice. A producer
that sends a queue's items to the consumer directly (`_route`) reads, in a slot of the same
page, how many of its items were taken, instead of a `_frames.Taken` per item.

Only a process on this host, in this process's PID namespace and under the same user can
map the page (through ``/proc/<pid>/fd/<fd>``, checked by a random nonce in the page); it
says so (`_frames.Tallied`) per slot, and until it has, the consumer reports every item it
takes, as everywhere else.

Each slot is a count written twice, one copy after the other; a reader that sees two
different copies caught a write halfway and keeps the count it had (it only ever grows).
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import sys

PAGE = 4096
NONCE = 16
SLOTS = (PAGE - NONCE) // 16  # queues one page counts for; later ones report every item


class TallyPage:
    """The consumer's page: one slot per queue it consumes."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("fiberexec-tally", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, PAGE)
        self.map = mmap.mmap(self.fd, PAGE)
        self.nonce = secrets.token_bytes(NONCE)
        self.map[:NONCE] = self.nonce
        self.counts = memoryview(self.map)[NONCE:].cast("Q")
        self.used = 0

    def slot(self) -> int | None:
        """A slot of its own for one more queue; None once the page is full."""
        if self.used >= SLOTS:
            return None
        self.used += 1
        return self.used - 1

    @property
    def path(self) -> str:
        """Where the broker maps it (sent with a slot and the nonce, `_frames.Tally`)."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def write(self, slot: int, count: int) -> None:
        self.counts[2 * slot] = count
        self.counts[2 * slot + 1] = count

    def close(self) -> None:
        self.counts.release()
        self.map.close()
        os.close(self.fd)


class TallyView:
    """A read-only mapping of one consumer's page (its broker's, or a producer's)."""

    def __init__(self, path: str, nonce: bytes) -> None:
        # never blocks (a FIFO of that number elsewhere), never takes a terminal
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != PAGE or (
                    info.st_uid != os.getuid()):
                raise OSError(f"{path} is not a consumer's tally page")
            self.map = mmap.mmap(fd, PAGE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        if self.map[:NONCE] != nonce:  # another process's descriptor of that number
            self.map.close()
            raise OSError(f"{path} is not the page this consumer announced")
        self.nonce = nonce
        self.counts = memoryview(self.map)[NONCE:].cast("Q")
        self.closed = False

    def read(self, slot: int) -> int | None:
        """The count in ``slot``; None if a write was halfway (read again later), or the
        page is closed."""
        for _ in range(100):  # a write is two stores: it is over before long
            if self.closed:
                return None
            second = self.counts[2 * slot + 1]
            first = self.counts[2 * slot]
            if first == second:
                return first
        return None

    def close(self) -> None:
        self.closed = True
        self.counts.release()
        self.map.close()


def available() -> bool:
    """Whether this platform has the pages (Linux: ``memfd`` and ``/proc``)."""
    return sys.platform == "linux" and hasattr(os, "memfd_create")
