"""Contexts and synchronization primitives, run against `multiprocessing` and ours."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]

CONTEXT_NAMES = ["Process", "Pipe", "Queue", "JoinableQueue", "SimpleQueue", "Lock", "RLock",
                 "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Value",
                 "Array", "RawValue", "RawArray", "Manager", "Pool", "cpu_count",
                 "current_process", "active_children", "parent_process", "get_context",
                 "get_start_method", "set_start_method", "freeze_support", "get_logger",
                 "log_to_stderr", "ProcessError", "TimeoutError", "AuthenticationError",
                 "BufferTooShort"]


def _run(mpm: ModuleType, target: object, *args: object) -> object:
    p = mpm.Process(target=target, args=args)
    p.start()
    return p


def test_contexts_have_the_module_api(mpm: ModuleType) -> None:
    assert {"spawn", "fork", "forkserver"} <= set(mpm.get_all_start_methods())
    for method in ("spawn", "fork", "forkserver"):
        ctx = mpm.get_context(method)
        assert ctx.get_start_method() == method
        assert all(hasattr(ctx, name) for name in CONTEXT_NAMES), method
        with pytest.raises(ValueError):
            ctx.set_start_method("spawn")
    with pytest.raises(ValueError):
        mpm.get_context("no-such-method")
    assert mpm.get_start_method() in mpm.get_all_start_methods()


def test_set_start_method_once_then_force(mpm: ModuleType) -> None:
    old = mpm.get_start_method(allow_none=True)
    try:
        mpm.set_start_method("spawn", force=True)
        assert mpm.get_start_method() == "spawn"
        with pytest.raises(RuntimeError, match="already been set"):
            mpm.set_start_method("fork")
    finally:
        mpm.set_start_method(old, force=True)


def test_context_objects_work_across_processes(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    lock, q = ctx.Lock(), ctx.Queue()
    assert lock.acquire()
    p = ctx.Process(target=t.report_try_acquire, args=(lock, q))
    p.start()
    assert q.get(timeout=60) == (False, False)
    p.join(60)
    lock.release()
    assert p.exitcode == 0


def test_lock_semantics(mpm: ModuleType) -> None:
    lock = mpm.Lock()
    assert lock.acquire(block=False) is True
    assert lock.acquire(block=False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    with pytest.raises(ValueError, match="released too many times"):
        lock.release()
    with lock:
        assert not lock.acquire(False)
    released_elsewhere = threading.Thread(target=lock.release)  # any holder may release
    assert lock.acquire()
    released_elsewhere.start()
    released_elsewhere.join()
    assert lock.acquire(False)
    lock.release()


def test_rlock_semantics(mpm: ModuleType) -> None:
    rlock = mpm.RLock()
    assert rlock.acquire() and rlock.acquire(timeout=1)
    errors: list[BaseException] = []

    def release_from_other_thread() -> None:
        try:
            rlock.release()
        except BaseException as exc:
            errors.append(exc)

    other = threading.Thread(target=release_from_other_thread)
    other.start()
    other.join()
    assert isinstance(errors[0], AssertionError)
    rlock.release()
    rlock.release()
    with pytest.raises(AssertionError):
        rlock.release()


def test_semaphores(mpm: ModuleType) -> None:
    sem = mpm.Semaphore(2)
    assert sem.get_value() == 2 and sem.acquire() and sem.acquire()
    assert not sem.acquire(timeout=0.01)
    q = mpm.Queue()
    p = _run(mpm, t.semaphore_try, sem, q)
    assert q.get(timeout=60) is False
    p.join(60)
    sem.release()
    sem.release()
    sem.release()  # unbounded
    assert sem.get_value() == 3
    bounded = mpm.BoundedSemaphore(1)
    with pytest.raises(ValueError):
        bounded.release()


def test_lock_guards_a_shared_counter(mpm: ModuleType) -> None:
    lock, counter = mpm.Lock(), mpm.Value("i", 0, lock=False)
    procs = [_run(mpm, t.increment, lock, counter, 50) for _ in range(3)]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert counter.value == 150


def test_event_across_processes(mpm: ModuleType) -> None:
    event, q = mpm.Event(), mpm.Queue()
    assert not event.is_set() and event.wait(0.01) is False
    p = _run(mpm, t.wait_event_then_put, event, q)
    event.set()
    assert q.get(timeout=60) is True and event.is_set()
    p.join(60)
    event.clear()
    assert not event.is_set()


def test_condition_wait_for_and_notify(mpm: ModuleType) -> None:
    cond, flag, q = mpm.Condition(), mpm.Value("i", 0), mpm.Queue()
    with pytest.raises(AssertionError):
        cond.wait(0.01)
    with pytest.raises(AssertionError):
        cond.notify()
    with cond:
        assert cond.wait(0.01) is False
        assert cond.wait_for(lambda: False, timeout=0.01) is False
    p = _run(mpm, t.wait_for_flag, cond, flag, q)
    assert q.get(timeout=60) == "waiting"
    with cond:  # the child waits (the lock is free again)
        flag.value = 1
        cond.notify_all()
    assert q.get(timeout=60) is True
    p.join(60)
    assert p.exitcode == 0
    with mpm.Condition(mpm.Lock()) as holds:
        assert holds
    with pytest.raises(AssertionError):
        mpm.Condition(mpm.Lock()).notify()


def test_barrier_rounds_and_abort(mpm: ModuleType) -> None:
    barrier, q = mpm.Barrier(3), mpm.Queue()
    procs = [_run(mpm, t.barrier_wait, barrier, q) for _ in range(2)]
    mine = barrier.wait(60)
    indices = sorted([mine, q.get(timeout=60), q.get(timeout=60)])
    assert indices == [0, 1, 2] and barrier.parties == 3
    for p in procs:
        p.join(60)
    lonely = mpm.Barrier(2)
    with pytest.raises(threading.BrokenBarrierError):
        lonely.wait(0.05)  # a timeout breaks the barrier, as in threading
    assert lonely.broken
    aborted, q2 = mpm.Barrier(2), mpm.Queue()
    p = _run(mpm, t.barrier_wait, aborted, q2)
    aborted.abort()  # before or while the child waits: either way its wait raises
    assert q2.get(timeout=60) == "BrokenBarrierError"
    p.join(60)


def test_an_event_says_whether_it_is_set(mpm: ModuleType) -> None:
    event = mpm.Event()
    assert re.fullmatch(r"<Event at 0x[0-9a-f]+ unset>", repr(event))
    event.set()
    assert re.fullmatch(r"<Event at 0x[0-9a-f]+ set>", repr(event))


def test_locks_and_events_are_freed_with_their_last_handle() -> None:
    """The process that made a lock or an event keeps it while a handle to it lives
    anywhere (a copy unpickled holds one of its own), and frees it with the last."""
    import gc
    import pickle

    import fiberexec.multiprocessing as fmp
    from fiberexec.multiprocessing._broker import get_broker
    from fiberexec.multiprocessing._proxies import _releaser

    broker = get_broker()

    def held() -> int:
        gc.collect()
        _releaser.flush()
        return len(broker.objects)

    base = held()
    made = [fmp.Lock() for _ in range(50)] + [fmp.Event() for _ in range(50)]
    assert held() == base + 50 + 50 * 5  # an event: a flag, a lock and a condition's three
    del made
    assert held() == base
    lock = fmp.Lock()
    copy = pickle.loads(pickle.dumps(lock))
    del lock
    assert held() == base + 1
    assert copy.acquire(timeout=5)  # the copy still reaches it
    copy.release()
    oid = copy._oid
    del copy
    assert held() == base
    with pytest.raises(ReferenceError, match="freed when the last handle"):
        broker.obj(oid)


def _through_broker(handle: Any) -> Any:
    """A copy of one of our locks or semaphores that calls the broker holding it, as a
    process of another host does (one that cannot open the kernel semaphore by name)."""
    from fiberexec.multiprocessing._sync import _rebuild_semlock

    ep = handle._endpoint
    copy = _rebuild_semlock(type(handle), ep.address, ep.secret, handle._oid,
                            ("", 0, handle._maxvalue))
    assert copy._sem is None and handle._sem is not None
    return copy


def test_a_process_that_cannot_open_the_semaphore_shares_it_through_the_broker() -> None:
    """One lock, whichever way a process reaches it: the kernel semaphore itself (this
    host), or calls to the broker that acquires and releases the same semaphore for it."""
    import fiberexec.multiprocessing as fmp

    lock, q = fmp.Lock(), fmp.Queue()
    remote = _through_broker(lock)
    with lock:
        p = _run(fmp, t.report_try_acquire, remote, q)
        assert q.get(timeout=60) == (False, False)
        p.join(60)
    counter = fmp.Value("i", 0, lock=False)
    procs = [_run(fmp, t.increment, handle, counter, 300) for handle in (lock, remote, remote)]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert counter.value == 900
    assert lock.acquire(False)  # nothing holds it: each release reached the one semaphore
    lock.release()


def test_a_condition_waited_on_through_the_broker_is_notified_from_here() -> None:
    import copy

    import fiberexec.multiprocessing as fmp

    cond, flag, q = fmp.Condition(), fmp.Value("i", 0), fmp.Queue()
    remote = copy.copy(cond)
    for part in ("_lock", "_sleeping_count", "_woken_count", "_wait_semaphore"):
        setattr(remote, part, _through_broker(getattr(cond, part)))
    p = _run(fmp, t.wait_for_flag, remote, flag, q)
    assert q.get(timeout=60) == "waiting"
    with cond:  # the child waits through the broker (its RLock is free again)
        flag.value = 1
        cond.notify_all()
    assert q.get(timeout=60) is True
    p.join(60)
    assert p.exitcode == 0


ENDS_WITH_LOCKS = """
import importlib, os, sys
mp = importlib.import_module(sys.argv[1])
kept = [mp.Lock(), mp.RLock(), mp.Semaphore(3), mp.Event(), mp.Condition(), mp.Value("i", 1)]
kept[0].acquire()
print(os.getpid(), flush=True)
"""


def test_a_program_that_ends_leaves_no_semaphore_and_no_warning(mpm: ModuleType) -> None:
    """Locks and events alive at the end (a global's) are removed from /dev/shm as the
    program ends, without the resource tracker's warning of leaked semaphores."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", ENDS_WITH_LOCKS, mpm.__name__],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    pid = int(done.stdout)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"sem.fiberexec-mp{pid}-")]


def test_locks_are_as_fast_as_the_kernel_allows_in_a_process_of_this_host() -> None:
    """A process that can open the semaphore (on local, every child) uses it itself: no
    call to the broker, which would be one per acquire and one per release."""
    import fiberexec.multiprocessing as fmp
    from tests.conftest import BACKEND

    lock, q = fmp.Lock(), fmp.Queue()
    counter = fmp.Value("i", 0, lock=False)
    for handle, times in ((lock, 500), (_through_broker(lock), 5)):
        p = _run(fmp, t.increment_and_report_calls, handle, counter, times, q)
        opened, calls = q.get(timeout=60)
        p.join(60)
        assert calls == (0 if opened else 2 * times), (opened, calls)
        assert opened or handle is not lock or BACKEND != "local"
    assert counter.value == 505


FORKS_THEN_EXITS = """
import os, sys
import fiberexec.multiprocessing as fmp
lock, value = fmp.Lock(), fmp.Value("i", 3)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a normal exit: atexit, and the finalizers the child inherited, run
os.waitpid(pid, 0)
print(os.path.exists("/dev/shm/sem." + lock._name[1:]), flush=True)
"""


def test_a_forked_child_that_exits_leaves_its_parents_semaphores_alone() -> None:
    """It ran the finalizers it inherited: it removed its parent's semaphore names (later
    children could not open them) and the resource tracker complained of each (KeyError)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORKS_THEN_EXITS], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert "KeyError" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_reprs_say_who_holds_what(mpm: ModuleType) -> None:
    lock, rlock = mpm.Lock(), mpm.RLock()
    assert repr(lock) == "<Lock(owner=None)>" and repr(rlock) == "<RLock(None, 0)>"
    with lock, rlock, rlock:
        assert repr(lock) == "<Lock(owner=MainProcess)>"
        assert repr(rlock) == "<RLock(MainProcess, 2)>"
    assert repr(mpm.Semaphore(2)) == "<Semaphore(value=2)>"
    assert repr(mpm.BoundedSemaphore(3)) == "<BoundedSemaphore(value=3, maxvalue=3)>"
    assert repr(mpm.Condition(rlock)) == "<Condition(<RLock(None, 0)>, 0)>"


def test_a_process_killed_while_it_waits_through_the_broker_takes_nothing() -> None:
    """The broker waits on the semaphore for a process that cannot open it; if that one is
    killed meanwhile, what the broker then acquires for it is given back, not held for a
    process that is gone (nothing else could ever acquire it again)."""
    import time

    import fiberexec.multiprocessing as fmp

    for kind in ("Lock", "RLock", "Semaphore"):
        lock, q = getattr(fmp, kind)(), fmp.Queue()
        assert lock.acquire()
        p = _run(fmp, t.say_then_acquire, _through_broker(lock), q)
        q.get(timeout=60)
        time.sleep(0.3)  # (it waits in the broker by now: there is no sign to wait for)
        p.kill()  # (by its backend: its pid may be a container's own)
        p.join(60)
        lock.release()
        assert lock.acquire(timeout=10), kind
        lock.release()


def _semaphore_file(lock: Any) -> Path:
    """Where a lock's kernel semaphore is (glibc names it ``sem.<name>`` in /dev/shm)."""
    name = lock._name if hasattr(lock, "_name") else lock._semlock.name
    assert name, "the lock has no kernel semaphore"
    return Path("/dev/shm") / f"sem.{name.lstrip('/')}"


def _collect_dropped() -> None:
    """Collect what this process dropped, and send our handles' releases (a thread of
    ours sends them: `_proxies._Releaser`)."""
    import gc

    from fiberexec.multiprocessing._proxies import _releaser

    gc.collect()
    _releaser.flush()


def test_a_lock_a_killed_child_held_goes_with_its_creators_last_handle(mpm: ModuleType) -> None:
    """A child killed while it holds a copy of its parent's lock never releases it; the
    lock goes with the parent's last handle all the same, its semaphore out of /dev/shm."""
    import signal

    lock, q = mpm.Lock(), mpm.Queue()
    path = _semaphore_file(lock)
    assert path.exists()
    assert lock.acquire()
    p = _run(mpm, t.say_then_acquire, lock, q)
    q.get(timeout=60)  # it holds its copy, and waits on the semaphore
    p.kill()  # (by its backend: its pid may be a container's own)
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    del lock
    _collect_dropped()
    assert not path.exists(), f"{path.name} outlived its last live handle"


def test_a_killed_holder_releases_its_own_copy_and_no_other() -> None:
    """With its creator's handle dropped and one holder killed, a lock lives on for a live
    holder (one that calls the broker for it, as a process of another host does), and goes
    when that one ends."""
    import fiberexec.multiprocessing as fmp

    lock, q, go = fmp.Lock(), fmp.Queue(), fmp.Event()
    path = _semaphore_file(lock)
    assert lock.acquire()
    killed = _run(fmp, t.say_then_acquire, lock, q)
    live = _run(fmp, t.say_then_acquire_on, _through_broker(lock), go, q)
    q.get(timeout=60)
    q.get(timeout=60)
    killed.kill()
    killed.join(60)
    lock.release()
    del lock
    _collect_dropped()
    go.set()
    assert q.get(timeout=60) is True  # the broker still holds it for the live one
    live.join(60)
    assert live.exitcode == 0
    _collect_dropped()
    assert not path.exists(), f"{path.name} outlived its last holder"


CHILD_HANDS_OVER = """
import fiberexec.multiprocessing as mp


def make(q, done):
    made = (mp.Lock(), mp.Event(), mp.Value("i", 3))  # (kept until the parent has them)
    q.put(made)
    done.wait(60)


if __name__ == "__main__":
    q, done = mp.Queue(), mp.Event()
    p = mp.Process(target=make, args=(q, done))
    p.start()
    lock, event, value = q.get(timeout=60)
    done.set()
    p.join(60)
    print(p.exitcode, lock.acquire(timeout=5), value.value, flush=True)
"""


def test_a_child_whose_locks_are_held_elsewhere_exits_without_warnings(tmp_path: Any) -> None:
    """Its locks and values end with it (their names go; what others opened works on), as
    its finalizers would have ended them: its resource tracker found them left and warned
    of "leaked semaphore objects" at every such exit."""
    import subprocess
    import sys

    script = tmp_path / "hands_over.py"
    script.write_text(CHILD_HANDS_OVER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "3"]
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
