"""What a child of this process inherits, for one the launcher forks.

A child the standard library starts has its parent's state at that moment: a fork copies
it, and an exec keeps the umask, the niceness, the resource limits and the signals set to
be ignored (``signal.signal(SIGINT, SIG_IGN)`` before ``Pool()``, a common recipe). A
child forked by the launcher (`fiberexec._launcher`) has the launcher's instead, which
were the program's when the launcher started. `capture` reads them in the requesting
process; the child `apply`-s them.

Shared memory a child creates is registered with a resource tracker, which unlinks what is
still registered when its last user ends. A stdlib child uses its parent's tracker where
the parent runs one (a fork inherits its pipe; a spawned child is handed it), so a segment
a child makes for its parent outlives the child. `tracker_fd` gives ours the same: the
parent's tracker pipe, passed to the child, which `adopt_tracker` makes its own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterable, MutableMapping
from typing import NamedTuple

from fiberexec._signals import CATCHABLE, DEFAULT, IGNORE, getsignal, ignored, setsignal

ENV_TRACKER_FD = "FIBEREXEC_TRACKER_FD"  # a fresh child's inherited tracker pipe
_LIMITS = tuple(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))


class State(NamedTuple):
    umask: int | None  # None where /proc does not say (it cannot be read without a write)
    nice: int
    limits: tuple[tuple[int, int, int], ...]  # (resource, soft, hard)
    ignored: tuple[int, ...]  # signals set to SIG_IGN


def capture() -> State:
    """This process's state, as a child started now would inherit it."""
    limits = tuple((res, *resource.getrlimit(res)) for res in _LIMITS)
    return State(_umask(), os.getpriority(os.PRIO_PROCESS, 0), limits,
                 tuple(sig for sig in CATCHABLE if ignored(getsignal(sig))))


def apply(state: State, *, keep: Iterable[int] = ()) -> None:
    """(In the child.) Take ``state``; signals in ``keep`` stay as they are (the program
    handles them itself). A niceness or limit the child may not take (lowering one's
    niceness, raising a hard limit, without privilege) stays as inherited."""
    if state.umask is not None:
        os.umask(state.umask)
    if os.getpriority(os.PRIO_PROCESS, 0) != state.nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, state.nice)
    for res, soft, hard in state.limits:
        if resource.getrlimit(res) != (soft, hard):
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(res, (soft, hard))
    to_ignore, kept = set(state.ignored), {int(sig) for sig in keep}
    for sig in CATCHABLE:
        if sig in kept:
            continue
        if sig in to_ignore:
            setsignal(sig, IGNORE)
        elif ignored(getsignal(sig)):
            setsignal(sig, DEFAULT)


def _umask() -> int | None:
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 1 << 16)  # (about 1.5 KiB: one read, no text layer)
        finally:
            os.close(fd)
        at = status.index(b"\nUmask:") + 7
        return int(status[at:status.index(b"\n", at)], 8)
    except (OSError, ValueError):
        return None


def tracker_fd() -> int | None:
    """The write end of this process's resource tracker's pipe, for a child to share; None
    where it runs no tracker. None is started for the child (the stdlib's spawn starts one;
    its fork, the default, shares one only if it runs, as here): starting one costs a
    program's first result some 30 ms of an interpreter's start."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    if tracker is None or getattr(tracker._resource_tracker, "_fd", None) is None:
        return None  # (nothing here made shared memory or a lock the tracker records)
    try:
        return int(tracker.getfd())
    except (OSError, AttributeError):
        return None


def share_tracker(env: MutableMapping[str, str]) -> tuple[int, ...]:
    """For a child started afresh: the descriptors to pass it (``pass_fds``), named in
    ``env`` for `adopt_tracker`."""
    fd = tracker_fd()
    if fd is None:
        return ()
    env[ENV_TRACKER_FD] = str(fd)
    return (fd,)


def adopt_tracker(fd: int | None = None) -> None:
    """(In the child.) Register shared memory with the parent's tracker, whose pipe is
    ``fd`` (else the one ``FIBEREXEC_TRACKER_FD`` names, if any)."""
    if fd is None:
        named = os.environ.pop(ENV_TRACKER_FD, "")
        if not named.isdigit():
            return
        fd = int(named)
    from multiprocessing import resource_tracker

    os.set_inheritable(fd, False)  # (as the stdlib keeps it: passed on only when asked)
    resource_tracker._resource_tracker._fd = fd  # type: ignore[attr-defined]
