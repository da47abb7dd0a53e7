"""Functions the tests run in workers and processes (importable by reference)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import fiberexec.multiprocessing as mp


def square(x: int) -> int:
    return x * x


def add(a: int, b: int) -> int:
    return a + b


def fail(x: Any) -> None:
    raise ValueError(f"bad {x}")


def fail_on(x: int, bad: int = 3) -> int:
    if x == bad:
        raise ValueError(f"bad {x}")
    return x


def unpicklable() -> threading.Lock:
    return threading.Lock()


def kill_self_on(x: int, victim: int) -> int:
    if x == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def exit_with(code: Any) -> None:
    sys.exit(code)


def sleep_forever() -> None:
    threading.Event().wait(600)


def put_pid(q: Any) -> None:
    q.put(os.getpid())


def say_and_put_parent(q: Any, words: str) -> None:
    print(words, file=sys.stderr, flush=True)
    q.put(os.getppid())


def put_parent_and_env(q: Any, names: list[str]) -> None:
    q.put((os.getppid(), {name: os.environ.get(name) for name in names}))


def echo_pipe(conn: Any) -> None:
    while True:
        try:
            msg = conn.recv_bytes()
        except EOFError:
            return
        conn.send_bytes(msg)


def queue_roundtrip(inq: Any, outq: Any) -> int:
    item = inq.get(timeout=30)
    outq.put(item)
    return len(item) if hasattr(item, "__len__") else 0


def read_once_then_put(conn: Any, q: Any, n: int, size: int) -> None:
    """Read one message from ``conn`` (what follows it stays unread), put ``n`` items of
    ``size`` bytes on ``q``, and end at once."""
    conn.recv()
    for i in range(n):
        q.put(bytes([i]) * size)


def big_through_pipe(conn: Any, size: int) -> None:
    data = conn.recv()
    conn.send(len(data) == size and data[-1:] == b"\x07")


def consume(q: Any, results: Any) -> None:
    while (item := q.get(timeout=30)) is not None:
        results.put(item * 2)
        q.task_done()
    q.task_done()


def count_init(marker: Any) -> None:
    os.environ["FIBEREXEC_TEST_INIT"] = str(marker)


def read_init(_: Any) -> str | None:
    return os.environ.get("FIBEREXEC_TEST_INIT")


def manager_work(d: Any, lst: Any, lock: Any, ns: Any, value: Any) -> None:
    with lock:
        d["n"] = d.get("n", 0) + 1
        value.value = value.value + 1
    lst.append(os.getpid())
    ns.seen = True


class SlowEnv:
    """A simulated environment whose step takes about 15 ms (waiting on a simulator)."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def step(self, action: int) -> int:
        time.sleep(0.015)
        self.state += action
        return self.state


class Subclass(mp.Process):
    """A Process subclass overriding run(); here so workers can import it by reference."""

    def __init__(self, q: mp.Queue) -> None:
        super().__init__()
        self.q = q

    def run(self) -> None:
        self.q.put((mp.current_process().name, os.getpid()))


@mp.meta(cpu=0.5, memory="256Mi", gpu=1)
def heavy(x: int) -> int:
    """A function that declares the resources it needs."""
    return x + 1


@mp.meta(cpu=1, memory=100)  # as a program written for Fiber says it: memory in MiB
def fiber_heavy(x: int) -> int:
    """A function that declares its resources in Fiber's units."""
    return x * 2


def worker_id() -> str:
    """Which worker ran this (pids repeat across containers; worker ids do not)."""
    return os.environ["FIBEREXEC_WORKER_ID"]


def unpicklable_x(_: Any) -> threading.Lock:
    return threading.Lock()


def hand_out_handles(out: Any) -> None:
    """Create a queue, a simple queue and a pipe here, send them out, and stay alive."""
    q, sq = mp.Queue(), mp.SimpleQueue()
    mine, theirs = mp.Pipe()
    out.put((q, sq, theirs, os.getpid()))
    time.sleep(600)
    mine.close()


def simple_get_with_timeout(sq: Any, out: Any) -> None:
    import queue

    start = time.monotonic()
    try:
        sq.get(timeout=0.2)
    except queue.Empty:
        out.put(("empty", time.monotonic() - start))


_INIT_END: Any = None


def keep_end(end: Any) -> None:
    """A pool initializer: keep ``end`` for this worker's tasks."""
    global _INIT_END
    _INIT_END = end


def send_through_kept_end(i: int) -> int:
    _INIT_END.send((os.getpid(), i))
    return os.getpid()


def send_and_close(conn: Any, what: Any) -> str:
    conn.send(what)
    conn.close()
    return "sent"


def fetch_end_and_echo(q: Any) -> None:
    """Take a pipe end from ``q`` and echo what comes through it until end-of-file."""
    conn = q.get(timeout=60)
    while True:
        try:
            conn.send(conn.recv())
        except EOFError:
            return


class ExitWhenUnpickled:
    """Pickles to a call of ``os._exit(3)``: a process that unpickles it dies there."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os._exit, (3,))

    def __call__(self) -> None:
        raise AssertionError("never called: the server dies before")


def done_twice(q: Any, told: Any) -> None:
    """Take one item of a `JoinableQueue` and mark two done; say what the second did."""
    q.get(timeout=30)
    q.task_done()
    try:
        q.task_done()
    except ValueError as exc:
        told.put("too many" if "too many" in str(exc) else repr(exc))
    else:
        told.put("no error")
