"""One thread that waits for the exit of every local worker process.

    start_worker ──> pidfd_open(pid) ──add()──> queue + wake-up pipe ──> reaper thread
    reaper thread: epoll on every pidfd and the pipe; a readable pidfd means "exited"
                   ──> on_exit(key) (outside the lock), pidfd closed

A pidfd refers to one process, so a pid recycled after the process was reaped is never
mistaken for it. The thread starts with the first process and ends at `close`. Where the
platform has no pidfds (not Linux), each process gets a thread blocked in ``wait()`` instead.
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import subprocess
import threading
from collections.abc import Callable

HAVE_PIDFD = hasattr(os, "pidfd_open")


def open_pidfd(proc: subprocess.Popen[bytes]) -> int | None:
    """A pidfd for ``proc``, opened before anyone can reap it; None without pidfd support."""
    if not HAVE_PIDFD:
        return None
    return os.pidfd_open(proc.pid)


class Reaper:
    """Calls ``on_exit(key)`` once, from its one thread, when the process of ``key`` exits."""

    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self._on_exit = on_exit
        self._added: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._wake_r, self._wake_w = -1, -1

    def add(self, key: str, pidfd: int | None, proc: subprocess.Popen[bytes]) -> None:
        """Watch ``proc``; the reaper owns (and closes) ``pidfd`` from now on."""
        if pidfd is None:  # no pidfds here: one waiting thread for this process
            threading.Thread(target=self._wait_one, args=(key, proc), daemon=True,
                             name="fiberexec-local-wait").start()
            return
        with self._lock:
            if self._closed:
                os.close(pidfd)
                return
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe()
                os.set_blocking(self._wake_w, False)
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="fiberexec-local-reaper")
                self._thread.start()
            self._added.put((pidfd, key))
            self._wake()

    def close(self, timeout: float = 5.0) -> None:
        """End the thread; pidfds still watched are closed and reported no more. Idempotent."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if self._wake_w >= 0:  # the thread has not closed its pipe yet
                self._wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already wakes the thread
            os.write(self._wake_w, b"x")

    def _wait_one(self, key: str, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()  # returns when the process ends: no polling
        self._on_exit(key)

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ, None)
            try:
                while not self._closed:
                    for key, _ in selector.select():  # no timeout: a pidfd or the pipe wakes it
                        if key.data is None:
                            self._drain(selector)
                        else:
                            self._exited(selector, key.fd, key.data)
            finally:
                self._close_all(selector)

    def _drain(self, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        while True:
            try:
                pidfd, key = self._added.get_nowait()
            except queue.Empty:
                return
            selector.register(pidfd, selectors.EVENT_READ, key)

    def _exited(self, selector: selectors.BaseSelector, pidfd: int, key: str) -> None:
        selector.unregister(pidfd)
        os.close(pidfd)
        self._on_exit(key)

    def _close_all(self, selector: selectors.BaseSelector) -> None:
        for key in list(selector.get_map().values()):
            selector.unregister(key.fd)
            if key.data is not None:  # a pidfd; the pipe is closed below
                os.close(key.fd)
        while True:
            try:
                os.close(self._added.get_nowait()[0])
            except queue.Empty:
                break
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
