"""Enough file descriptors for the workers an executor may serve.

Each worker costs the executor a listening socket, its connection, nng's wake-up pipes and a
selector slot: about 4 descriptors. The soft limit is raised to what ``max_workers`` needs;
when even the hard limit is too low, starting fails with a message that says so.
"""

from __future__ import annotations

import resource
import select

from fiberexec._errors import ConfigurationError

PER_WORKER = 4
RESERVE = 128  # the program's own files, sockets and pipes


def needed(max_workers: int) -> int:
    return PER_WORKER * max_workers + RESERVE


def ensure(max_workers: int) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to what ``max_workers`` workers need."""
    want = needed(max_workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        raise ConfigurationError(
            f"max_workers={max_workers} needs about {want} file descriptors, but the hard "
            f"limit is {hard} (ulimit -Hn); raise it, or lower max_workers"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def readable_within(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds (None: wait for it).
    With `poll`, not `select`, which refuses descriptors from 1024 on: an executor of many
    workers, whose limit is raised above, holds those."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))
