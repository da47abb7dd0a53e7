"""`Poller`: which of a shard's descriptors are readable, each with the object it stands for.

What `selectors.EpollSelector` does for a shard, without the key it builds for every
registration and every ready descriptor: a thread waiting for a result takes its worker's
link off the shard's poller and puts it back once a round trip (`Shard.collect`), and the
shard's thread asks it what is ready once a turn.
"""

from __future__ import annotations

import math
import select
from typing import Generic, TypeVar

D = TypeVar("D")
_GONE = object()


class Poller(Generic[D]):
    """Descriptors registered for reading, each with its ``data``."""

    def __init__(self) -> None:
        self._epoll = select.epoll(flags=select.EPOLL_CLOEXEC)
        self._data: dict[int, D] = {}

    def fileno(self) -> int:
        """Readable when a registered descriptor is (another thread may poll it)."""
        return self._epoll.fileno()

    def register(self, fd: int, data: D) -> None:
        """Watch ``fd``; `select` reports it with ``data``. `KeyError` if it is watched."""
        if fd in self._data:
            raise KeyError(f"descriptor {fd} is already registered")
        self._epoll.register(fd, select.EPOLLIN)
        self._data[fd] = data

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (`KeyError` if it is not); one closed already is let go."""
        del self._data[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:  # closed: the kernel dropped it from the set with its last reference
            pass

    def select(self, timeout: float | None) -> list[tuple[D, int]]:
        """The data and events of the descriptors ready within ``timeout`` seconds (None:
        however long it takes), rounded up to the millisecond, as `selectors` does, so a
        deadline a fraction of a millisecond away is not polled for in a busy loop."""
        wait = -1.0 if timeout is None else math.ceil(max(timeout, 0.0) * 1000) / 1000
        # One a waiting thread took off meanwhile (the shard's thread polls without `owner`)
        # is not reported: looked up once, as another thread may remove it at any moment.
        get, ready = self._data.get, []
        for fd, events in self._epoll.poll(wait, max(len(self._data), 1)):
            data = get(fd, _GONE)
            if data is not _GONE:
                ready.append((data, events))
        return ready  # type: ignore[return-value]  # (_GONE filtered out)

    def close(self) -> None:
        self._epoll.close()
        self._data.clear()
