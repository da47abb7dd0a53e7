"""`current_process()` in a pool's workers and the count of processes, as the stdlib's.

Here, not in tests/mp: what a worker is told comes from the pool's settings, the same on
every backend, so the local backend's run covers it (a backend's env starts containers,
pods or jobs for each pool).
"""

from __future__ import annotations

import functools
import importlib
import os

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import MODULES


@pytest.mark.parametrize("module", MODULES)
def test_pool_workers_and_processes_are_named_and_counted_as_the_stdlibs(module: str) -> None:
    """A pool's worker is a daemon (to the stdlib's view too) named
    ``<start method>PoolWorker-N`` (N its identity, which programs seed with), the pool's
    process its parent, and logging's processName says so; a Process counts whether it is
    named or not, and the main process is (). (The pool's workers end with it; the
    processes are never started.)"""
    mpm = importlib.import_module(module)
    assert mpm.current_process()._identity == ()
    with mpm.Pool(2) as pool:
        seen = set(pool.map(functools.partial(t.who_am_i, mpm.__name__), range(40),
                            chunksize=1))
    assert seen, seen
    for name, identity, daemon, parent, logged, stdlib_daemon in seen:
        assert len(identity) == 1 and name.endswith(f"PoolWorker-{identity[0]}"), seen
        assert daemon and parent == os.getpid() and logged == name and stdlib_daemon, seen
    assert len({identity for _, identity, *_ in seen}) == len(seen)
    first, named, third = (mpm.Process(target=t.cube, args=(1,), name=n)
                           for n in (None, "named", None))
    (count,) = first._identity
    assert (named.name, named._identity, third._identity) == ("named", (count + 1,),
                                                              (count + 2,))
    assert third.name == f"{type(third).__name__}-{count + 2}"
