"""Task functions the tests send to workers (importable, so every backend can load them)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def identity(x: Any) -> Any:
    return x


def square(x: int) -> int:
    return x * x


def add(a: int, b: int = 0) -> int:
    return a + b


def pid(_: object = None) -> int:
    return os.getpid()


def worker_id(_: object = None) -> str:
    """Which worker ran this (pids repeat across containers, worker ids do not)."""
    return os.environ["FIBEREXEC_WORKER_ID"]


def sleep_return(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def exit_now(code: int) -> None:
    os._exit(code)


def say_then_die(tag: str, how: str) -> None:
    """Flush a line to stdout and one to stderr, then die at once (``exit``: ``os._exit``;
    ``segfault``: SIGSEGV), as a task whose native code crashes its process."""
    print(f"{tag}: last words", flush=True)
    print(f"{tag}: on stderr", file=sys.stderr, flush=True)
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGSEGV)


def log_then_die(lines: int) -> None:
    """Log ``lines`` lines to stderr (flushed, each), say last words, and die at once."""
    for i in range(lines):
        print(f"step {i}", file=sys.stderr)
    print("last words", flush=True)
    os._exit(3)


def kill_self(_: object = None) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def segfault_after(seconds: float) -> None:
    """Die of SIGSEGV ``seconds`` into the task, as a fault in native code would."""
    time.sleep(seconds)
    os.kill(os.getpid(), signal.SIGSEGV)


def stop_self(_: object = None) -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _signal_once(marker: str, value: int, sig: signal.Signals) -> int:
    """Send ``sig`` to this worker the first time any worker runs this; then return ``value``."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return value
    os.close(fd)
    os.kill(os.getpid(), sig)
    return value


def kill_self_once(marker: str, value: int) -> int:
    """SIGKILL this worker the first time; a worker dying mid-task."""
    return _signal_once(marker, value, signal.SIGKILL)


def hang_once(marker: str, value: int) -> int:
    """SIGSTOP this worker the first time; a hung worker, as seen from outside."""
    return _signal_once(marker, value, signal.SIGSTOP)


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("this object refuses to be pickled")


def return_unpicklable(_: object = None) -> Unpicklable:
    return Unpicklable()


def record_init(path: str) -> None:
    with open(path, "a") as f:
        f.write(f"{worker_id()}\n")


def touch_path(path: str) -> str:
    """Create the file ``path`` names (an absolute path); any other text is returned as it is."""
    if path.startswith("/"):
        open(path, "w").close()
    return path


def record_pid(path: str) -> None:
    """An initializer for any executor: this process's pid, one line."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")


def fail_init() -> None:
    raise RuntimeError("initializer refused")


def nbytes(array: Any) -> int:
    return int(array.nbytes)


def make_array(n: int) -> Any:
    import numpy as np

    return np.arange(n, dtype=np.int64)


def negate_inplace(array: Any) -> Any:
    array *= -1
    return array


_shared: tuple[Any, Any] | None = None  # set by `remember_shared` in a worker


def host_view(_: object = None) -> tuple[int, int, int]:
    """Which pid namespace and which /dev/shm the worker has (a container has its own pid
    namespace; another host, its own /dev/shm)."""
    shm = os.stat("/dev/shm")
    return os.stat("/proc/self/ns/pid").st_ino, shm.st_dev, shm.st_ino


def remember_shared(queue: Any, counter: Any) -> None:
    """An initializer given a stdlib multiprocessing Queue and Value."""
    global _shared
    _shared = (queue, counter)
    queue.put(("init", 0))


def attach_segment(name: str) -> None:
    """An initializer: attach a stdlib shared memory segment by name, and keep it."""
    from multiprocessing import shared_memory

    global _segment
    _segment = shared_memory.SharedMemory(name=name)


def segment_byte_and_tracker(index: int) -> tuple[int, int | None]:
    """The attached segment's byte at ``index``, and the pid of the resource tracker this
    process registers with (None: none)."""
    from multiprocessing import resource_tracker

    assert _segment is not None, "the initializer did not run"
    tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
    return _segment.buf[index], tracker._pid


_segment: Any = None


def report_and_count(x: int) -> int:
    assert _shared is not None, "the initializer did not run"
    queue, counter = _shared
    with counter.get_lock():
        counter.value += 1
    queue.put(("task", x))
    return x


def send_on(conn: Any, message: Any) -> str:
    conn.send(message)
    conn.close()
    return "sent"


def slow_unless_first(directory: str, seconds: float) -> None:
    """An initializer: the first worker to run it returns at once, the others after
    ``seconds``; each leaves ``begun-*`` and then ``done-*`` in ``directory``."""
    import uuid
    from pathlib import Path

    here, me = Path(directory), uuid.uuid4().hex
    (here / f"begun-{me}").touch()
    try:
        os.close(os.open(here / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        time.sleep(seconds)
    (here / f"done-{me}").touch()


def allocate_mib(mib: int) -> int:
    """Allocate and touch ``mib`` MiB; return how many were held."""
    block = bytearray(mib << 20)
    return len(block) >> 20


def raise_memory_error() -> None:
    raise MemoryError("out of room")


def address_space_limit(_: object = None) -> tuple[int, int]:
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)


def getenv(name: str) -> str | None:
    return os.environ.get(name)


def sleep_pid(seconds: float) -> int:
    """Sleep, then say which worker process ran the task."""
    time.sleep(seconds)
    return os.getpid()


def hold_the_gil(said: str | None = None) -> int:
    """One C call that holds the GIL for many minutes: no thread of the worker runs. With
    ``said``, a FIFO's path, first say "holding" into it (its open waits for a reader)."""
    if said is not None:
        with open(said, "w") as fifo:
            fifo.write("holding\n")
    return sum(range(10**13))


def sleep_loaded(seconds: float, module: str) -> tuple[int, int, bool]:
    """Sleep, then say which worker ran the task, its parent, and whether ``module`` was
    imported in it."""
    time.sleep(seconds)
    return os.getpid(), os.getppid(), module in sys.modules


def sum_then_scribble(array: Any) -> float:
    """The argument's sum as it arrived, then change it in place (a task's own copy)."""
    total = float(array.sum())
    array += 1.0
    return total


def hold_until(started: Any, release: Any) -> Any:
    """Say so on ``started`` (a Connection), then wait for what comes on ``release``."""
    started.send(os.getpid())
    started.close()
    if not release.poll(60):
        raise TimeoutError("nobody released the task within 60s")
    return release.recv()


class CountedRepr:
    """An argument that counts, in the process that made it, how often it is described."""

    shown = 0

    def __repr__(self) -> str:
        type(self).shown += 1
        return "<counted>"


def hold_with(started: Any, release: Any, _argument: Any) -> Any:
    """`hold_until`, with one more argument it does not use."""
    return hold_until(started, release)


def hold_init(started: Any, release: Any) -> None:
    """An initializer that waits (as `hold_until`) until the test lets it finish."""
    hold_until(started, release)


def log_then_fail_init(queue: Any) -> None:
    """An initializer that sends this process's logging to ``queue`` (a stdlib
    ``QueueHandler``, as CPython's own tests do), logs a line, then raises."""
    import logging
    import logging.handlers

    for name in ("concurrent.futures", "tests.init"):
        logger = logging.getLogger(name)
        logger.addHandler(logging.handlers.QueueHandler(queue))
        logger.propagate = False
    logging.getLogger("tests.init").error("initializer giving up")
    raise ValueError("error in initializer")
def tagged_lines(tag: str, lines: int) -> str:
    """Print ``lines`` lines, each naming ``tag`` and its number; return ``tag``."""
    for i in range(lines):
        print(f"{tag} line {i}")
    return tag


def chatter(lines: int, value: Any = None) -> Any:
    """Print ``lines`` numbered lines to stdout and one to stderr; return ``value``."""
    import sys

    for i in range(lines):
        print(f"line {i}")
    print("to stderr", file=sys.stderr)
    return value


def imported(module: str) -> bool:
    """Whether ``module`` is imported in this worker already."""
    return module in sys.modules


def spin(seconds: float, value: Any = None) -> Any:
    """Keep this thread on the CPU, holding the GIL, for ``seconds`` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return value


def thread_switches(_: object = None) -> int:
    """Times this process's threads other than the main one gave up the CPU (woke and slept)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total


def backtrack(n: int) -> int:
    """Hold the interpreter lock in C for a while that grows fast with ``n`` (a regular
    expression backtracking): no other thread of the worker runs meanwhile."""
    import re

    re.match(r"(a+)+$", "a" * n + "b")
    return n


def say_unfinished(text: str) -> str:
    """Print ``text`` with no line end; return it."""
    print(text, end="")
    return text


def _interrupt(_: object) -> None:
    raise KeyboardInterrupt("raised while unpickling")


class InterruptsUnpickling:
    """Pickles fine; rebuilding it raises `KeyboardInterrupt`."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_interrupt, (1,))


def return_interrupting(_: object = None) -> InterruptsUnpickling:
    return InterruptsUnpickling()


def _signal_then(signum: int, value: Any) -> Any:
    signal.raise_signal(signum)  # as a signal arriving just then: its handler runs
    return value


class SignalAsUnpickled:
    """Pickles fine; as it is rebuilt, the process gets signal ``signum`` (SIGINT: as from
    Ctrl-C)."""

    def __init__(self, signum: int, value: Any) -> None:
        self.signum, self.value = signum, value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_signal_then, (self.signum, self.value))


def return_signal_as_unpickled(signum: int, value: Any, delay: float = 0.0) -> SignalAsUnpickled:
    """After ``delay`` seconds (so the caller is waiting for it by then, not still
    submitting it), a result that signals the process reading it."""
    time.sleep(delay)
    return SignalAsUnpickled(signum, value)


def mapped(name: str) -> bool:
    """Whether a library whose file name contains ``name`` is loaded in this process."""
    with open("/proc/self/maps") as maps:
        return any(name in line for line in maps)


def read_only_array(n: int) -> Any:
    import numpy as np

    return np.frombuffer(bytes(range(n)), dtype=np.uint8)  # read-only: bytes are immutable


def sized_bytes(n: int) -> bytes:
    return b"x" * n


class TwoArgumentError(Exception):
    """Pickles (as every exception, by its ``args``) but cannot be rebuilt from them."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_two_argument_error(message: str) -> None:
    raise TwoArgumentError(message, 2)


class UnpicklableError(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("not this one")


def raise_unpicklable_error(message: str) -> None:
    raise UnpicklableError(message)


def gil_sleep(seconds: float, value: Any = None, said: str | None = None) -> Any:
    """Wait ``seconds`` inside one C call that keeps the interpreter lock (`ctypes.PyDLL`
    does not release it): no other thread of the worker runs meanwhile. With ``said``, a
    FIFO's path, first say "holding" into it (its open waits for a reader)."""
    import ctypes

    if said is not None:
        with open(said, "w") as fifo:
            fifo.write("holding\n")
    if seconds > 0:
        ctypes.PyDLL(None).usleep(int(seconds * 1e6))
    return value


def stop_at_three(x: int) -> int:
    """Raise StopIteration for 3 (as ``next()`` on an empty iterator in user code does)."""
    if x == 3:
        raise StopIteration("nothing left")
    return x * 10


def add_unless_three(x: int, y: int) -> int:
    """``x + y``, but StopIteration for ``x == 3`` (``next(iter([]))``, as user code does)."""
    if x == 3:
        next(iter([]))
    return x + y


def gil_busy(seconds: float, value: Any = None) -> Any:
    """Compute for at least ``seconds`` in C calls that keep the interpreter lock (each a
    `sum` over a range, measured first so that one lasts at least ``seconds``)."""
    n = 1 << 20
    while True:
        started = time.perf_counter()
        sum(range(n))
        took = time.perf_counter() - started
        if took >= seconds:
            return value
        n = int(n * max(2.0, 1.5 * seconds / max(took, 1e-6)))


def mark(path: str) -> str:
    """Leave a file at ``path`` (the call ran)."""
    with open(path, "w"):
        pass
    return path


def start_child_then_hang_at_exit(_: object = None) -> int:
    """Start a long child process (in the worker's process group, as a forked pool's
    workers are) and make the worker's own exit hang (a thread that is not a daemon and
    does not end, as such a pool's manager thread joining hung workers); the child's pid."""
    import subprocess
    import threading

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    threading.Thread(target=time.sleep, args=(120,), daemon=False).start()
    return child.pid


def import_module(name: str, pause: float = 0.0) -> tuple[int, int, bool]:
    """Import ``name``; this worker's pid, its parent's, and whether it had the module
    before (``pause``: then wait, so that the tasks of a round land on distinct workers)."""
    import importlib

    had = name in sys.modules
    importlib.import_module(name)
    time.sleep(pause)
    return os.getpid(), os.getppid(), had


def numpy_draw(pause: float = 0.0) -> tuple[int, bool, float]:
    """This worker's pid, whether it had numpy before, and a draw from numpy's global
    generator."""
    had = "numpy" in sys.modules
    import numpy as np

    time.sleep(pause)
    return os.getpid(), had, float(np.random.random())


def new_file_mode_and_files_limit(path: str) -> tuple[int, int]:
    """The permission bits a file made here gets (the umask), and the soft limit of open
    files."""
    import resource

    with open(path, "w"):
        pass
    mode = os.stat(path).st_mode & 0o777
    os.unlink(path)
    return mode, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def process_name(_: object = None) -> str:
    """The name `multiprocessing.current_process` (and logging's ``processName``) gives."""
    import multiprocessing

    return multiprocessing.current_process().name


def blas_threads(*_: object) -> tuple[dict[str, str], list[int]]:
    """The numerical libraries' thread variables this worker has, and the threads its
    OpenBLAS will use (`fiberexec._threads`)."""
    import numpy  # noqa: F401  # (loads OpenBLAS, which reads the variables once)
    import threadpoolctl

    from fiberexec import _threads

    env = {name: os.environ[name] for name in _threads.VARIABLES if name in os.environ}
    return env, [pool["num_threads"] for pool in threadpoolctl.threadpool_info()
                 if pool["internal_api"] == "openblas"]
