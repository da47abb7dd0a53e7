"""Manager proxies and AsyncManager parallelism."""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future, wait

import pytest

import fiberexec.multiprocessing as mp
from tests.mp import tasks


def test_proxies_shared_with_processes() -> None:
    with mp.Manager() as m:
        d, lst, lock, ns = m.dict(), m.list(), m.RLock(), m.Namespace(a=1)
        value = m.Value("i", 0)
        procs = [mp.Process(target=tasks.manager_work, args=(d, lst, lock, ns, value))
                 for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert d["n"] == 3 and value.value == 3 and len(lst) == 3
        assert ns.a == 1 and ns.seen is True
        assert sorted(lst) == sorted(p.pid for p in procs)


def test_sync_primitives_behave_like_threading() -> None:
    with mp.Manager() as m:
        rlock = m.RLock()
        assert rlock.acquire() and rlock.acquire(timeout=1)
        rlock.release()
        rlock.release()
        with pytest.raises(RuntimeError):
            rlock.release()
        event = m.Event()
        assert not event.wait(0.05)
        event.set()
        assert event.is_set() and event.wait(1)
        sem = m.Semaphore(1)
        assert sem.acquire() and not sem.acquire(timeout=0.05)
        cond = m.Condition()
        with cond:
            assert cond.wait(0.05) is False
            assert cond.wait_for(lambda: True, timeout=1)
        barrier = m.Barrier(1)
        assert barrier.wait(5) == 0 and barrier.parties == 1
        q = m.Queue()
        q.put(3)
        assert q.get(timeout=1) == 3
        with pytest.raises(queue.Empty):
            q.get(timeout=0.05)
        arr = m.Array("i", [1, 2, 3])
        arr[0] = 7
        assert list(arr) == [7, 2, 3] and len(arr) == 3
        lst = m.list([1])
        lst += [2]
        assert list(lst) == [1, 2] and lst[1] == 2 and 2 in lst
        d = m.dict(a=1)
        assert sorted(d.keys()) == ["a"] and d.get("b", 0) == 0


def test_async_manager_steps_objects_in_parallel() -> None:
    class Manager(mp.AsyncManager):
        pass

    Manager.register("Env", tasks.SlowEnv)
    n, rounds = 8, 5
    with Manager() as m:
        envs = [m.Env(i) for i in range(n)]
        first = envs[0].step(0)
        assert isinstance(first, Future) and first.result(60) == 0
        start = time.monotonic()
        for _ in range(rounds):
            for env in envs:
                env.step(1).result(60)
        sequential = time.monotonic() - start
        start = time.monotonic()
        for _ in range(rounds):
            done, _ = wait([env.step(1) for env in envs], timeout=60)
            assert len(done) == n
        parallel = time.monotonic() - start
        assert [env.step(0).result(60) for env in envs] == [i + 2 * rounds for i in range(n)]
    # sequential is at least n * rounds * 15 ms = 0.6 s; in parallel it is ~rounds * 15 ms
    assert sequential >= n * rounds * 0.015
    assert parallel * 3 < sequential, (sequential, parallel)



class _DoomedManager(mp.managers.BaseManager):
    pass


_DoomedManager.register("doomed", callable=tasks.ExitWhenUnpickled())


def test_a_server_that_dies_starting_is_reported_at_once() -> None:
    """The start waits for the server's address or its exit, whichever comes first, and
    says which exit code it died with."""
    manager = _DoomedManager()
    started = time.monotonic()
    with pytest.raises(mp.ProcessError, match=r"exit codes \[3\]"):
        manager.start()
    assert time.monotonic() - started < 30  # not the start timeout (120 s)
