"""Managers as the standard library's: shared objects freed with their last proxy, live
iterators, a manager's Pool, its errors, and calls that Ctrl-C interrupts."""

from __future__ import annotations

import gc
import multiprocessing.managers
import os
import pickle
import re
import signal
import threading
import time
from types import ModuleType

import pytest

import fiberexec.multiprocessing as fmp
from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]


class _Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise RuntimeError("cannot pickle")


def test_an_object_is_freed_with_its_last_proxy(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        d = m.dict()
        assert m._number_of_objects() == 1
        p = mpm.Process(target=t.use_copy_then_exit, args=(d,))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and "child" in d
        copy = pickle.loads(pickle.dumps(d))  # a copy holds a reference of its own
        del d
        gc.collect()
        assert m._number_of_objects() == 1
        copy["here"] = 1
        assert sorted(copy.keys()) == ["child", "here"]
        del copy
        gc.collect()
        assert m._number_of_objects() == 0
        made = [m.list(range(3)) for _ in range(20)]
        assert m._number_of_objects() == 20
        del made
        gc.collect()
        assert m._number_of_objects() == 0


def test_a_copy_of_a_freed_object_unpickles_and_says_so_when_used() -> None:
    """A proxy unpickled after its object was freed (its last proxy dropped) is made all
    the same; its calls say the object is gone and why (the standard library's raises
    `KeyError` from the unpickling itself)."""
    with fmp.Manager() as m:
        d = m.dict()
        pickled = pickle.dumps(d)
        del d
        gc.collect()
        assert m._number_of_objects() == 0
        copy = pickle.loads(pickled)
        with pytest.raises(ReferenceError, match="freed when the last proxy"):
            copy["x"] = 1


def test_iterators_see_changes_made_while_they_run(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        a = m.list(range(10))
        it = iter(a)
        assert list(it) == list(range(10))
        assert list(it) == []
        it = iter(a)
        a[0] = 100
        assert next(it) == 100
        d = m.dict({i: i * i for i in range(5)})
        it = iter(d)
        assert next(it) == 0
        d.clear()
        with pytest.raises(RuntimeError):
            next(it)


def test_a_managers_pool_and_event(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        with m.Pool(2) as pool:
            assert pool.map(t.c_long, range(5)) == list(range(5))
            assert pool.apply_async(t.c_long, (7,)).get(60) == 7
            assert list(pool.imap(t.c_long, range(4))) == list(range(4))
        event = m.Event()
        assert re.fullmatch(r"<EventProxy object, typeid 'Event' at 0x[0-9a-f]+>", repr(event))
        assert not event.is_set()
        event.set()
        assert event.wait(1)


def test_errors_are_the_stdlibs(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        with pytest.raises(multiprocessing.managers.RemoteError):
            m.Pool(0)  # raised making the object: RemoteError, with the server's text
        shared = m.list()
        with pytest.raises(RuntimeError, match="cannot pickle"):
            shared.append(_Unpicklable())  # what the pickler raised, as itself
        with pytest.raises(IndexError):
            shared.pop()  # a method's error comes back as itself
        big = b"x" * (8 << 20)
        shared.append(big)
        assert shared[0] == big


def test_ctrl_c_interrupts_a_call_waiting_in_the_manager(mpm: ModuleType) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")  # pragma: no cover
    # Python's own Ctrl-C handler, even where SIGINT was ignored when we started (CI jobs)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with mpm.Manager() as m:
        q = m.Queue()
        # as Ctrl-C in a terminal: the signal reaches the main thread, blocked in the call
        timer = threading.Timer(0.5, signal.pthread_kill,
                                (threading.main_thread().ident, signal.SIGINT))
        start = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                q.get(timeout=20)
        finally:
            signal.signal(signal.SIGINT, previous)
        assert time.monotonic() - start < 10
        if mpm is fmp:
            # the interrupted call's connection is dropped: the next call gets its own
            # answer (the stdlib's next call on this thread reads the get's late answer)
            d = m.dict()
            d["k"] = 1
            assert d["k"] == 1


def test_a_ctrl_c_at_the_terminal_leaves_the_manager_serving(mpm: ModuleType) -> None:
    """A terminal's Ctrl-C reaches the whole process group, the manager's server too: it
    ignores it (bpo-36368), so the parent's ``except KeyboardInterrupt`` can still read
    the shared state. (Ours died, and the first call after raised ConnectionError.)"""
    with mpm.Manager() as m:
        scores = m.dict({"member-0": 0.9})
        server = m._process if mpm is not fmp else m._servers.procs[0]
        os.kill(server.pid, signal.SIGINT)
        time.sleep(0.5)  # its delivery (nothing to wait on: a killed server says nothing)
        assert server.is_alive()
        assert dict(scores) == {"member-0": 0.9}


def test_keyword_arguments_may_be_named_as_the_callers_own_parameters(mpm: ModuleType) -> None:
    """``self``, ``typeid``, ``fn`` and ``func`` reach the callee as keywords, as in the
    stdlib, whose own parameters before them are positional-only."""
    with mpm.Pool(1) as pool:
        for name in ("self", "fn", "func"):
            assert pool.apply(t.keyword_names, (), {name: 1}) == [name]
            assert pool.apply_async(t.keyword_names, kwds={name: 1}).get(60) == [name]
    with mpm.Manager() as manager:
        assert dict(manager.dict(self=1, typeid=2)) == {"self": 1, "typeid": 2}
        d = manager.dict()
        d.update(self=3)
        assert dict(d) == {"self": 3}
