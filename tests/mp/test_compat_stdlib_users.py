"""Standard-library code handed this module's context runs as with the stdlib's own:
`multiprocessing.pool.Pool(context=...)`, `multiprocessing.queues.Queue(ctx=...)`, and
``connection.wait`` on a queue's ``_reader`` (an idiom for waiting on several queues).

These reach into the stdlib queues' and locks' private parts (``_reader``, ``_writer``,
``_semlock``); the tests pin what they use. `ProcessPoolExecutor(mp_context=...)` and the
parent's script and import path in children are in test_compat_scripts.py.
"""

from __future__ import annotations

import multiprocessing.pool
import multiprocessing.queues
from multiprocessing.connection import wait
from types import ModuleType

import pytest

from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]

pytestmark = pytest.mark.timeout(120)


def test_the_stdlib_pool_runs_on_the_module_context(mpm: ModuleType) -> None:
    with multiprocessing.pool.Pool(2, context=mpm.get_context()) as pool:
        assert pool.map(t.cube, range(8)) == [x ** 3 for x in range(8)]
        assert sorted(pool.imap_unordered(t.cube, range(5), chunksize=2)) == [0, 1, 8, 27, 64]
        failing = pool.apply_async(t.fail_with, ("from a worker",))
        with pytest.raises(ValueError, match="from a worker"):
            failing.get(60)
        assert pool.apply(t.cube, (3,)) == 27
        pool.close()
        pool.join()


LEFT_OPEN = """
import multiprocessing.pool
import sys
import time
import importlib

mp = importlib.import_module(sys.argv[1])
if __name__ == "__main__":
    pool = multiprocessing.pool.Pool(2, context=mp.get_context())
    print(pool.map(abs, [-1, -2]), flush=True)
    pool.map_async(time.sleep, [0.5] * 8)  # still running at exit
"""


def test_a_stdlib_pool_left_open_ends_with_the_program(mpm: ModuleType) -> None:
    """Neither closed nor joined: the stdlib's exit function terminates it (its threads
    wait on the workers' sentinels until then) and the program ends, with no traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LEFT_OPEN, mpm.__name__],
                          capture_output=True, text=True, timeout=90, check=False)
    assert (done.returncode, done.stdout) == (0, "[1, 2]\n"), done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr


EXIT_HANDLER = """
import atexit
import importlib
import sys

mp = importlib.import_module(sys.argv[1])


def handler():
    child = mp.Process(target=print, args=("at exit",))
    child.start()
    child.join(60)
    print("exitcode", child.exitcode, flush=True)


if __name__ == "__main__":
    atexit.register(handler)  # before the module's first use: it runs after its cleanup
    child = mp.Process(target=print, args=("in main",))
    child.start()
    child.join()
"""


def test_a_process_started_by_an_exit_handler_runs(mpm: ModuleType) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", EXIT_HANDLER, mpm.__name__],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["in main", "at exit", "exitcode 0"], done.stderr


def test_the_stdlib_pool_replaces_workers_after_maxtasksperchild(mpm: ModuleType) -> None:
    with multiprocessing.pool.Pool(1, maxtasksperchild=2, context=mpm.get_context()) as pool:
        assert [pool.apply(t.c_long, (i,)) for i in range(5)] == list(range(5))
        pool.terminate()


def test_a_queue_reader_can_be_waited_on(mpm: ModuleType) -> None:
    for q in (mpm.Queue(), mpm.SimpleQueue()):
        go = mpm.Event()
        p = mpm.Process(target=t.put_later, args=(q, {"item": 1}, go))
        p.start()
        reader = q._reader
        assert q._reader is reader
        assert wait([reader], timeout=0.2) == []
        assert not reader.poll()
        go.set()
        assert wait([reader], timeout=60) == [reader]
        assert reader.poll()
        assert reader.recv() == {"item": 1}
        assert not reader.poll(0.1)
        p.join(60)
        assert p.exitcode == 0


def test_queue_ends_send_and_receive_pickles(mpm: ModuleType) -> None:
    q = mpm.SimpleQueue()
    q._writer.send(("sent", 1))
    assert q.get() == ("sent", 1)
    q.put(["put", 2])
    assert q._reader.recv() == ["put", 2]
    q.put("bytes")
    raw = q._reader.recv_bytes()
    q._writer.send_bytes(raw)
    assert q.get() == "bytes"


def test_the_stdlib_queue_on_the_module_context_counts_with_its_semaphore(
        mpm: ModuleType) -> None:
    ctx = mpm.get_context()
    q = multiprocessing.queues.Queue(2, ctx=ctx)
    try:
        assert q.empty() and not q.full() and q.qsize() == 0
        q.put("a")
        q.put("b")
        assert q.full() and q.qsize() == 2
        assert q.get(timeout=30) == "a"
        assert not q.full() and q.qsize() == 1
        assert q.get(timeout=30) == "b"
    finally:
        q.close()
        q.join_thread()
    lock = ctx.Lock()
    assert not lock._semlock._is_mine() and lock._semlock._get_value() == 1
    with lock:
        assert lock._semlock._is_mine() and lock._semlock._count() == 1
        assert lock._semlock._is_zero()
    rlock = ctx.RLock()
    with rlock, rlock:
        assert rlock._semlock._is_mine() and rlock._semlock._count() == 2
    assert rlock._semlock._count() == 0
    sem = ctx.BoundedSemaphore(3)
    sem.acquire()
    assert sem._semlock._get_value() == 2 and not sem._semlock._is_zero()
    sem.release()
