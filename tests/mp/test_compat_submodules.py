"""The package's submodules, as the stdlib's: ``from fiberexec.multiprocessing.pool import
Pool`` and the rest, with every name of the stdlib submodule's ``__all__``."""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import subprocess
import sys
from types import ModuleType

import pytest

import fiberexec.multiprocessing as fmp
from tests.mp import compat_tasks as t
from tests.mp.compat import mpm
from tests.support.kit import BackendKit

__all__ = ["mpm"]

SUBMODULES = ["connection", "context", "dummy", "managers", "pool", "process", "queues",
              "reduction", "shared_memory", "sharedctypes", "synchronize", "util"]


@pytest.mark.parametrize("name", SUBMODULES)
def test_each_submodule_has_the_stdlib_names(name: str) -> None:
    ours = importlib.import_module(f"fiberexec.multiprocessing.{name}")
    theirs = importlib.import_module(f"multiprocessing.{name}")
    missing = [n for n in getattr(theirs, "__all__", ()) if not hasattr(ours, n)]
    assert missing == []
    # and its other public names, which programs use too (``multiprocessing.queues.Empty``)
    others = [n for n in vars(theirs) if not n.startswith("_") and not hasattr(ours, n)]
    assert others == []
    assert getattr(fmp, name) is ours  # also an attribute of the package, as once imported


def test_the_package_lists_every_name_before_any_is_used() -> None:
    """The pool, the managers and the submodules are imported on first use; ``dir()`` (and
    so an editor's completion) lists them from the start, as the stdlib's does."""
    program = ("import multiprocessing, fiberexec.multiprocessing as fmp\n"
               "names = set(dir(fmp))\n"
               "print(sorted(set(fmp.__all__) - names))\n"
               "print(sorted(set(multiprocessing.__all__) - names))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


def _sub(mpm: ModuleType, name: str) -> ModuleType:
    return importlib.import_module(f"{mpm.__name__}.{name}")


def test_names_outside_all_are_the_stdlib_ones_where_they_are_not_ours() -> None:
    import multiprocessing.queues
    import queue

    import fiberexec.multiprocessing.pool
    import fiberexec.multiprocessing.queues

    assert fiberexec.multiprocessing.queues.Empty is queue.Empty
    assert fiberexec.multiprocessing.pool.TimeoutError is fmp.TimeoutError
    assert issubclass(fmp.TimeoutError, multiprocessing.TimeoutError)
    with pytest.raises(AttributeError, match="module 'fiberexec.multiprocessing.queues' has "
                                             "no attribute 'Nothing'"):
        fiberexec.multiprocessing.queues.Nothing  # noqa: B018
    assert multiprocessing.queues.Queue is not fiberexec.multiprocessing.queues.Queue


def test_submodule_names_work_as_the_stdlib_ones(mpm: ModuleType) -> None:
    ctx = mpm.get_context()
    with _sub(mpm, "pool").Pool(2) as pool:
        assert pool.map(t.cube, range(4)) == [0, 1, 8, 27]
    with _sub(mpm, "pool").ThreadPool(2) as pool:
        assert pool.map(t.cube, range(4)) == [0, 1, 8, 27]
    r, w = _sub(mpm, "connection").Pipe(duplex=False)
    assert _sub(mpm, "connection").wait([r], timeout=0.1) == []
    w.send("x")
    assert _sub(mpm, "connection").wait([r], timeout=30) == [r] and r.recv() == "x"
    q = _sub(mpm, "queues").SimpleQueue(ctx=ctx)
    q.put(1)
    assert q.get() == 1
    lock = _sub(mpm, "synchronize").Lock(ctx=ctx)
    assert lock.acquire(timeout=1) and not lock.acquire(False)
    lock.release()
    sharedctypes = _sub(mpm, "sharedctypes")
    original = sharedctypes.RawArray(ctypes.c_int, [1, 2, 3])
    duplicate = sharedctypes.copy(original)
    original[0] = 10
    assert list(duplicate) == [1, 2, 3] and list(original) == [10, 2, 3]
    value = sharedctypes.synchronized(sharedctypes.RawValue("d", 1.5))
    with value.get_lock():
        value.value += 1
    assert value.value == 2.5
    assert isinstance(mpm.current_process(), _sub(mpm, "process").BaseProcess)
    # the function itself: calling it makes the stdlib's logger, which changes what every
    # later spawned child (loky's too) is sent
    assert _sub(mpm, "util").get_logger is multiprocessing.util.get_logger
    assert issubclass(_sub(mpm, "context").TimeoutError, multiprocessing.TimeoutError)


def test_shared_memory_manager_unlinks_its_segments_at_shutdown(
        mpm: ModuleType, mp_backend: BackendKit) -> None:
    from multiprocessing import shared_memory

    managers = _sub(mpm, "managers")
    with managers.SharedMemoryManager() as smm:
        segment = smm.SharedMemory(64)
        shared = smm.ShareableList([1, "two", 3.0])
        p = mpm.Process(target=t.write_segment, args=(segment.name, b"from a child"))
        p.start()
        p.join(60)
        if mpm is not fmp or mp_backend.same_host:
            assert p.exitcode == 0
            assert bytes(segment.buf[:12]) == b"from a child"
        else:  # a child on another host has another /dev/shm (the README: same host only)
            assert p.exitcode == 1
        assert list(shared) == [1, "two", 3.0]
        names = [segment.name, shared.shm.name]
        segment.close()
        shared.shm.close()
    for name in names:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)
    unstarted = managers.SharedMemoryManager()
    with pytest.raises((ValueError, AttributeError)):
        unstarted.SharedMemory(8)
