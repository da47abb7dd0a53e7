"""Functions run in child processes by the tests parametrized over both modules."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import time
from typing import Any


def report_try_acquire(lock: Any, q: Any) -> None:
    q.put((lock.acquire(False), lock.acquire(timeout=0.05)))


def increment(lock: Any, counter: Any, times: int) -> None:
    for _ in range(times):
        with lock:
            counter.value += 1


def increment_and_report_calls(lock: Any, counter: Any, times: int, q: Any) -> None:
    """`increment`, then put whether ``lock`` opened its kernel semaphore here, and how
    many calls on a broker's object (a lock's) this process made meanwhile."""
    from fiberexec.multiprocessing import _rpc
    from fiberexec.multiprocessing._calls import CallObject

    made = []
    original = _rpc.RpcClient.call

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(args[0], CallObject):  # (not a shared value's bytes, say)
            made.append(args[0])
        return original(self, *args, **kwargs)

    _rpc.RpcClient.call = counted  # type: ignore[method-assign]
    try:
        increment(lock, counter, times)
    finally:
        _rpc.RpcClient.call = original  # type: ignore[method-assign]
    q.put((lock._sem is not None, len(made)))


def wait_event_then_put(event: Any, q: Any) -> None:
    q.put(event.wait(30))


def wait_for_flag(cond: Any, flag: Any, q: Any) -> None:
    with cond:
        q.put("waiting")
        q.put(cond.wait_for(lambda: flag.value == 1, timeout=30))


def barrier_wait(barrier: Any, q: Any) -> None:
    try:
        q.put(barrier.wait(30))
    except Exception as exc:
        q.put(type(exc).__name__)


def semaphore_try(sem: Any, q: Any) -> None:
    q.put(sem.acquire(timeout=0.05))


def fill_array(arr: Any, value: Any) -> None:
    for i in range(len(arr)):
        arr[i] = value * i


def double_ends(arr: Any) -> None:
    """Double the first and last items (two reads and two writes, wherever ``arr`` is)."""
    arr[0] *= 2
    arr[len(arr) - 1] *= 2


def write_values(v: Any, raw: Any, s: Any) -> None:
    v.value = 2.5
    raw[1] = 7
    s.value = b"hi"


def attach_and_write(shm: Any) -> None:
    shm.buf[:5] = b"hello"
    shm.close()


def attach_read_tracker(name: str) -> tuple[int, int | None]:
    """Attach a segment by name, read its first byte, close it; and the pid of the
    resource tracker this process registers with (None: none)."""
    from multiprocessing import resource_tracker, shared_memory

    segment = shared_memory.SharedMemory(name=name)
    try:
        return segment.buf[0], resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
    finally:
        segment.close()


def attach_and_unlink(name: str) -> None:
    from multiprocessing import resource_tracker, shared_memory

    segment = shared_memory.SharedMemory(name=name)
    segment.close()
    segment.unlink()
    tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
    if tracker._pid is not None:  # a tracker of this process's own: let it finish its work
        tracker._stop()


def remote_write(blob: bytes) -> None:
    """Unpickle a shared value where the creator's /dev/shm file cannot be seen."""
    import tempfile

    from fiberexec import _shm

    with tempfile.TemporaryDirectory() as empty:
        _shm.SHM_DIR = empty  # another host: no such file here
        value, array = pickle.loads(blob)
    assert type(array).__name__ == "RemoteArray", type(array)
    with value.get_lock():
        value.value += 10
    array[1] = 5
    array[2:4] = [6, 7]
    assert array[:] == [0, 5, 6, 7]


def put_authkey(q: Any) -> None:
    import multiprocessing

    q.put(bytes(multiprocessing.current_process().authkey))


def put_parent(q: Any, module_name: str) -> None:
    import importlib

    parent = importlib.import_module(module_name).parent_process()
    q.put((parent.name, parent.pid, parent.is_alive()))


def start_grandchild(module_name: str, q: Any) -> None:
    import importlib

    mp = importlib.import_module(module_name)
    child = mp.Process(target=put_parent, args=(q, module_name))
    child.start()
    child.join(60)
    q.put(("joined", child.exitcode))


def proxy_work(  # noqa: PLR0917  # a Process target takes positional args
        lst: Any, d: Any, lock: Any, event: Any, ns: Any, value: Any, arr: Any,
               q: Any, sem: Any, cond: Any) -> None:
    with lock:
        lst.append(os.getpid())
        d["child"] = True
    with sem:
        value.value += 1
    arr[0] = 9
    ns.x = "set"
    q.put("done")
    with cond:
        cond.notify_all()
    event.set()


def set_item(d: Any) -> None:
    d["from child"] = 1


def c_long(x: int) -> int:
    return ctypes.c_long(x).value


def sleep_long() -> None:
    import time

    time.sleep(120)


def make_lock() -> Any:
    import threading

    return threading.Lock()


def make_lock_for(_: object) -> Any:
    return make_lock()


def send_many_then_exit(conn: Any, n: int) -> None:
    for i in range(n):
        conn.send(i)


def relay(inbox: Any, outbox: Any) -> None:
    while True:
        try:
            item = inbox.recv()
        except EOFError:
            outbox.close()
            return
        outbox.send(item * 2)


def queue_echo(inq: Any, outq: Any, n: int) -> None:
    for _ in range(n):
        outq.put(inq.get(timeout=60))


class Maths:
    """A class registered with a manager: importable wherever its server runs."""

    def add(self, a: int, b: int) -> int:
        return a + b

    def secret(self) -> str:
        return "hidden"

    def child(self) -> Maths:
        return Maths()



def take_one_then_idle(q: Any, got: Any, stop: Any) -> None:
    """Take one item, report it, then stay alive without taking more until told."""
    got.put(q.get(timeout=60))
    stop.wait(60)


def take_n_then_idle(q: Any, got: Any, n: int, stop: Any) -> None:
    """Take ``n`` items, report them, then stay alive without taking more until told."""
    got.put([q.get(timeout=60) for _ in range(n)])
    stop.wait(60)


def take_sizes(q: Any, got: Any, n: int) -> None:
    """Take one item and report it; then take ``n`` byte strings and report each one's
    first byte and length."""
    got.put(q.get(timeout=60))
    items = [q.get(timeout=60) for _ in range(n)]
    got.put([(item[0], len(item)) for item in items])


def take_n(q: Any, got: Any, n: int) -> None:
    got.put([q.get(timeout=60) for _ in range(n)])


def take_until_none(q: Any, got: Any, go: Any = None) -> None:
    if go is not None:
        go.wait(60)
    taken = []
    while (item := q.get(timeout=60)) is not None:
        taken.append(item)
    got.put(taken)


def say_then_take_until_none(q: Any, got: Any, go: Any) -> None:
    """Take one item and say so, then, once ``go`` is set, take until None and report
    what was taken."""
    got.put(q.get(timeout=60))
    take_until_none(q, got, go)


def wait_then_double(conn: Any) -> None:
    """Wait for the pipe with `multiprocessing.connection.wait`, then answer each message."""
    import multiprocessing.connection

    while multiprocessing.connection.wait([conn], timeout=60) == [conn]:
        try:
            conn.send(conn.recv() * 2)
        except EOFError:
            return


def answer_then_queue_on_event(conn: Any, q: Any, go: Any, answers: int) -> None:
    """Answer ``answers`` messages on ``conn``; once ``go`` is set, put into ``q`` (over
    the same stream to the creator) with no message on ``conn`` to follow it."""
    for _ in range(answers):
        conn.send(conn.recv() * 2)
    go.wait(60)
    q.put("queued")
    with contextlib.suppress(EOFError):
        conn.recv()  # until the creator closes its end


def answer_then_queue(conn: Any, q: Any) -> None:
    """Answer a message on ``conn``; at the next, first put into ``q`` (over the same
    stream to the creator), then answer."""
    conn.send(conn.recv() * 2)
    item = conn.recv()
    q.put("queued")
    conn.send(item * 2)
    with contextlib.suppress(EOFError):
        conn.recv()  # until the creator closes its end


def use_copy_then_exit(d: Any) -> None:
    """Write through a proxy copy; the copy is dropped when the process ends."""
    d["child"] = os.getpid()


def cube(x: int) -> int:
    return x * x * x


def fail_with(message: str) -> None:
    raise ValueError(message)


def put_later(q: Any, item: Any, go: Any) -> None:
    go.wait(60)
    q.put(item)


def write_segment(name: str, data: bytes) -> None:
    from multiprocessing import shared_memory

    segment = shared_memory.SharedMemory(name=name)
    try:
        segment.buf[:len(data)] = data
    finally:
        segment.close()


def take_then_say(q: Any, n: int, go: Any, done: Any, rounds: int) -> None:
    for _ in range(rounds):
        go.wait(60)
        go.clear()
        for _ in range(n):
            q.get(timeout=60)
        done.set()
    go.wait(60)  # alive until the creator has counted the last round


def touch_unique(directory: str) -> None:
    """An initializer: leave one new file in ``directory`` per call."""
    with open(os.path.join(directory, f"init-{os.getpid()}"), "x"):
        pass


def keyword_names(**kwds: Any) -> list[str]:
    return sorted(kwds)


class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("y", ctypes.c_int)]


def move_point(v: Any, raw: Any) -> None:
    with v.get_lock():  # (reentrant: each field's access takes it too)
        v.x += 1.0
        v.y = 7
    raw.x = 9.5


def who_am_i(module: str,
             _item: object) -> tuple[str, tuple[int, ...], bool, int | None, str, bool]:
    """How ``module`` (the stdlib's multiprocessing or ours) sees this process: its name,
    identity, daemon flag, its parent's pid; and the name the stdlib's logging shows, and
    the stdlib's daemon flag (which refuses a daemon children)."""
    import importlib
    import multiprocessing

    mpm = importlib.import_module(module)
    me, parent = mpm.current_process(), mpm.parent_process()
    stdlib = multiprocessing.current_process()
    return (me.name, me._identity, me.daemon, None if parent is None else parent.pid,
            stdlib.name, stdlib.daemon)


class HoldsALock(Exception):
    """An exception a pool cannot send back: it holds a lock."""

    def __init__(self, message: str) -> None:
        import threading

        super().__init__(message)
        self.lock = threading.Lock()


def raise_holding_a_lock(_: object) -> None:
    raise HoldsALock("query failed")


def exit_with(code: int) -> None:
    raise SystemExit(code)


def say_then_acquire(lock: Any, q: Any) -> None:
    """Say so, then wait to acquire ``lock`` (until killed)."""
    q.put(os.getpid())
    lock.acquire()


def say_then_acquire_on(lock: Any, go: Any, q: Any) -> None:
    """Say so, wait for ``go``, then put whether ``lock`` could be acquired."""
    q.put(os.getpid())
    go.wait(60)
    q.put(lock.acquire(timeout=10))


def timed_gets_until_none(q: Any, got: Any, timeout: float) -> None:
    """Get with ``timeout`` until None comes, doing something else for as long after each
    get that found nothing; send back each item with when its get began and ended
    (``time.monotonic``, one clock for every process of the host)."""
    import queue
    import time

    takes = []
    while True:
        began = time.monotonic()
        try:
            item = q.get(timeout=timeout)
        except queue.Empty:
            time.sleep(timeout)
            continue
        ended = time.monotonic()
        if item is None:
            break
        takes.append((item, began, ended))
    got.put(takes)


def simple_queue_double(inq: Any, outq: Any, n: int) -> None:
    """Take ``n`` items from ``inq`` (a SimpleQueue, whose get takes no timeout in the
    stdlib) and put each doubled on ``outq``."""
    for _ in range(n):
        outq.put(inq.get() * 2)


def inherited_state(q: Any, path: str) -> None:
    """Put what this process inherited: the mode its umask gives a new file, whether SIGINT
    is ignored, its niceness, its soft limit of open files."""
    import resource

    with open(path, "w"):
        pass
    mode = os.stat(path).st_mode & 0o777
    os.unlink(path)
    q.put((mode, signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
           os.getpriority(os.PRIO_PROCESS, 0), resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def sigint_ignored(_: object = None) -> bool:
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def shared_memory_made(q: Any = None) -> str:
    """Make a shared memory segment holding b"made", leave it (closed, not unlinked) for
    the parent, and put (or return) its name."""
    from multiprocessing import shared_memory

    segment = shared_memory.SharedMemory(create=True, size=16)
    segment.buf[:4] = b"made"
    name = segment.name
    segment.close()
    if q is not None:
        q.put(name)
    return name


def take_one_put_large(inq: Any, outq: Any, size: int) -> None:
    """Take one item from ``inq`` (the rest stay there, or are sent ahead here, unread), put
    it back with ``size`` bytes on ``outq`` a moment later, and end at once."""
    item = inq.get()
    time.sleep(0.2)  # (what is sent ahead arrives meanwhile)
    outq.put((item, b"x" * size))
