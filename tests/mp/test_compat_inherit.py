"""What a child on this host inherits from its parent at its start, against `multiprocessing`
and ours: the umask, ignored signals, the niceness and resource limits as they are when it
starts (not when the program began), and the parent's resource tracker, so shared memory a
child makes for its parent outlives the child. (Local only: a container or another host
has its own.)

The stdlib's reference is its ``"spawn"`` context (the default ``"fork"`` gives the same:
a fork copies it all). Its ``"forkserver"``, which this suite uses elsewhere, does not: its
children have the state the server started with, as ours had before.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]


@pytest.fixture
def restored() -> Iterator[None]:
    """The test changes this process's umask, SIGINT, niceness and open-files limit: all
    but the niceness (which may not be lowered again) come back after it."""
    umask = os.umask(0o022)
    os.umask(umask)
    sigint = signal.getsignal(signal.SIGINT)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield
    os.umask(umask)
    signal.signal(signal.SIGINT, sigint)
    resource.setrlimit(resource.RLIMIT_NOFILE, files)


def _context(mpm: ModuleType) -> Any:
    return mpm.get_context("spawn") if mpm is multiprocessing else mpm


def test_a_child_has_its_parents_state_as_it_is_when_it_starts(
        mpm: ModuleType, restored: None, tmp_path: Path) -> None:
    mpm = _context(mpm)
    q = mpm.Queue()
    first = mpm.Process(target=t.inherited_state, args=(q, str(tmp_path / "a")))
    first.start()  # (ours: the launcher runs from here on)
    mode, ignored, nice, _files = q.get(timeout=60)
    first.join(60)
    umask = os.umask(0)
    os.umask(umask)
    assert (mode, ignored) == (0o666 & ~umask, False)
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(1)  # (the test process keeps it: niceness is not given back unprivileged)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1000) - 1, hard))
    second = mpm.Process(target=t.inherited_state, args=(q, str(tmp_path / "b")))
    second.start()
    assert q.get(timeout=60) == (0o600, True, nice + 1, min(soft, 1000) - 1)
    second.join(60)
    assert second.exitcode == 0


def test_pool_workers_made_while_sigint_is_ignored_ignore_it(
        mpm: ModuleType, restored: None) -> None:
    """The recipe for a pool that leaves Ctrl-C to its parent. (fiberexec's pool workers
    handle SIGINT themselves, to be interrupted at the program's exit; they are in a
    process group of their own, so a terminal's Ctrl-C does not reach them either way.)"""
    stdlib = mpm is multiprocessing
    mpm = _context(mpm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with mpm.Pool(2) as pool:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert pool.apply(t.sigint_ignored) is stdlib


def test_shared_memory_a_child_makes_outlives_the_child(mpm: ModuleType) -> None:
    """A stdlib child shares its parent's resource tracker where one runs (a fork's needs
    to: here the parent starts it), so a segment it leaves is the parent's to unlink."""
    resource_tracker.ensure_running()
    mpm = mpm.get_context("fork") if mpm is multiprocessing else mpm
    q = mpm.Queue()
    child = mpm.Process(target=t.shared_memory_made, args=(q,))
    child.start()
    name = q.get(timeout=60)
    child.join(60)
    with mpm.Pool(1, maxtasksperchild=1) as pool:
        names = [name, pool.apply(t.shared_memory_made)]
    for made in names:
        segment = shared_memory.SharedMemory(made)
        assert bytes(segment.buf[:4]) == b"made"
        segment.close()
        segment.unlink()
