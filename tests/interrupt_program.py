"""A program that Ctrl-C interrupts while it waits for long tasks (tests/test_interrupt.py).

``python -m tests.interrupt_program SYSTEM MODE TASKS DIR``: SYSTEM is ``stdlib`` or
``fiberexec``; MODE ``with`` (the executor's ``with`` block ends with the interrupt),
``bare`` (the program catches it and ends, leaving the executor to the interpreter's exit)
or ``sleep`` (as ``with``, the block sleeping rather than waiting for a task); TASKS long
tasks are submitted to two workers. Once two of them run, it waits for the first and
prints ``ready`` (`say_when_waiting`; at once with ``sleep``); the test sends SIGINT as a
terminal does. Each task writes ``DIR/started-PID``, and ``DIR/ended-PID`` when it ends,
however it ends.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

LONG = 120.0  # seconds a task would run if nothing interrupted it
READY_WAIT = 60.0  # seconds the program waits for two tasks to start


def long_task(folder: str) -> str:
    (Path(folder) / f"started-{os.getpid()}").touch()
    with open(Path(folder) / "ready", "wb", buffering=0) as fifo:
        fifo.write(b"x")
    try:
        time.sleep(LONG)
        return "finished"
    finally:
        (Path(folder) / f"ended-{os.getpid()}").touch()


def make(system: str) -> Executor:
    if system == "stdlib":
        return ProcessPoolExecutor(2)
    from fiberexec import FiberExecutor

    return FiberExecutor(2)


def main() -> None:
    system, mode, tasks, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    # A terminal's program gets Ctrl-C as KeyboardInterrupt (one started in the background
    # by a shell would ignore SIGINT: not what is tested here).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.mkfifo(Path(folder) / "ready")
    ex = make(system)
    try:
        if mode in ("with", "sleep"):
            with ex:
                wait_for_long_tasks(ex, tasks, folder, sleep=mode == "sleep")
        else:
            wait_for_long_tasks(ex, tasks, folder)
    except KeyboardInterrupt:
        print("interrupted", flush=True)


def wait_for_long_tasks(ex: Executor, tasks: int, folder: str, *, sleep: bool = False
                        ) -> None:
    fd = os.open(Path(folder) / "ready", os.O_RDONLY | os.O_NONBLOCK)
    ours = os.open(Path(folder) / "ready", os.O_WRONLY)  # so a task's close is no end-of-file
    try:
        futures = [ex.submit(long_task, folder) for _ in range(tasks)]
        deadline, seen = time.monotonic() + READY_WAIT, b""
        while len(seen) < 2:  # a byte from each task that started
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SystemExit("the tasks did not start")
            seen += os.read(fd, 2)
    finally:
        os.close(ours)
        os.close(fd)
    if sleep:
        print("ready", flush=True)
        time.sleep(LONG)
        return
    threading.Thread(target=say_when_waiting, args=(threading.main_thread(),),
                     daemon=True).start()
    futures[0].result()


def say_when_waiting(main: threading.Thread) -> None:
    """Print ``ready`` once the main thread waits in ``result()``: a Ctrl-C a moment
    earlier would interrupt the program elsewhere, which is not what is tested."""
    deadline, pause = time.monotonic() + READY_WAIT, threading.Event()
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main.ident or 0)
        names = set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        if {"result", "wait"} <= names:
            print("ready", flush=True)
            return
        pause.wait(0.01)  # (bounded: READY_WAIT)


if __name__ == "__main__":
    main()
