"""Where the tasks' forwarded output goes in the executor's process.

    shard thread: Heartbeat(stdout, stderr) -> OutputSink.put
        a few lines while nothing waits to be written: written here, at once
        else: appended for the writer thread (never blocks)
    writer thread: the lines, as the worker prefixed them (``[w12 host] ``) ->
                   sys.stdout / sys.stderr (looked up at each write, so redirections
                   apply), or unprefixed to ``<dir>/w12.out`` / ``.err``

Workers prefix their own lines: the executor does no work per line.

A task's lines come in the message before its result's, and a few lines are written on the
shard's thread before it reads on, where that write cannot block (`room_for`): so what a
task printed is on the terminal before its future is done, and the program's own
``print(f.result())`` comes after it. More than `DIRECT_MAX` at once, or more than a pipe or
terminal has room for now, goes to the writer thread, so a reader that does not keep up
(``| less`` left unscrolled, a paused terminal) holds up only that thread, never dispatch
and the workers' heartbeats. What it has not written is bounded by
`HELD_MAX`; past that, output is dropped and the drop is said in the output itself, once
per stretch, so nothing disappears silently.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import select
import stat
import sys
import termios
import threading
from collections import deque
from typing import IO, BinaryIO

HELD_MAX = 64 << 20  # bytes of output waiting for the writer thread
DIRECT_MAX = 256 << 10  # bytes a shard's thread writes itself when the writer has nothing
#                        (a worker's message holds about this much: see `_capture.SEND_AT`)
CLOSE_WAIT = 5.0  # seconds shutdown waits for the writer to finish writing
TTY_DIRECT_MAX = 4096  # bytes written on a shard's thread to a terminal ready for output
PENDING_MAX = 16 << 10  # what the program's own stream may hold unwritten (its flush first)
PAGE = 4096  # a pipe holds its bytes in pages: a short one still takes a whole slot


class OutputSink:
    """Writes workers' output lines; ``directory`` None: to this process's stdout/stderr."""

    def __init__(self, directory: str | None = None) -> None:
        """Raises `ConfigurationError` for a directory that cannot be made or written."""
        if directory is not None:
            try:
                os.makedirs(directory, exist_ok=True)
                if not os.access(directory, os.W_OK | os.X_OK):
                    raise PermissionError(f"no permission to write in {directory!r}")
            except OSError as exc:
                from fiberexec._errors import ConfigurationError

                raise ConfigurationError(
                    f"output={directory!r}: the tasks' output cannot go there ({exc}); name "
                    "a directory this process can create and write, or use \"forward\"") \
                    from exc
        self.directory = directory
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, str, bytes, bytes]] = deque()
        self._held = 0
        self._dropped = 0  # bytes dropped since the writer last caught up
        self._writing = 0  # batches being written now, by the writer or directly
        self._thread: threading.Thread | None = None
        self._closed = False
        self._files: dict[str, BinaryIO] = {}

    def put(self, worker_id: str, host: str, stdout: bytes, stderr: bytes) -> None:
        size = len(stdout) + len(stderr)
        with self._cond:
            if self._closed:
                return
            # Written on this thread if little, and nothing is queued or being written (so
            # lines keep their order): before the result that follows them is handed over.
            if (size <= DIRECT_MAX and not self._queue and not self._writing
                    and self._room_for(stdout, stderr)):
                self._writing += 1
            else:
                self._enqueue((worker_id, host, stdout, stderr), size)
                return
        try:
            with contextlib.suppress(Exception):  # as in the writer thread: a closed stream
                self._write(worker_id, host, stdout, stderr)
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify()

    def _room_for(self, stdout: bytes, stderr: bytes) -> bool:
        if self.directory is not None:
            return True  # files
        return ((not stdout or room_for(sys.stdout, len(stdout)))
                and (not stderr or room_for(sys.stderr, len(stderr))))

    def _enqueue(self, batch: tuple[str, str, bytes, bytes], size: int) -> None:
        """(With the lock held) for the writer thread."""
        if self._held + size > HELD_MAX:
            self._dropped += size
            return
        self._held += size
        self._queue.append(batch)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fiberexec-output",
                                            daemon=True)
            self._thread.start()
        self._cond.notify()

    def close(self) -> None:
        """Write what is queued (waiting at most `CLOSE_WAIT`), then close the files."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT)
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                # (after a direct write still under way: its lines came first)
                while not (self._queue and not self._writing) and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._held = 0
                self._writing += 1
                dropped, self._dropped = self._dropped, 0
            try:
                if dropped:
                    self._note(f"[fiberexec] {dropped} bytes of worker output dropped: "
                               f"this process's output did not keep up\n".encode())
                for worker_id, host, stdout, stderr in batch:
                    with contextlib.suppress(Exception):  # a closed stream must not end it
                        self._write(worker_id, host, stdout, stderr)
            finally:
                with self._cond:
                    self._writing -= 1

    def _write(self, worker_id: str, host: str, stdout: bytes, stderr: bytes) -> None:
        if self.directory is not None:
            for suffix, data in ((".out", stdout), (".err", stderr)):
                if data:
                    f = self._file(worker_id + suffix)
                    f.write(data)
                    f.flush()
            return
        for stream, data in ((sys.stdout, stdout), (sys.stderr, stderr)):
            if data:
                write_to(stream, data)

    def _note(self, text: bytes) -> None:
        with contextlib.suppress(Exception):
            if self.directory is not None:
                self._file("fiberexec.err").write(text)
            else:
                write_to(sys.stderr, text)

    def _file(self, name: str) -> BinaryIO:
        f = self._files.get(name)
        if f is None:
            assert self.directory is not None
            os.makedirs(self.directory, exist_ok=True)
            f = self._files[name] = open(os.path.join(self.directory, name), "ab")  # noqa: SIM115
        return f


def write_to(stream: IO[str] | None, data: bytes) -> None:
    if stream is None:
        return
    stream.flush()  # what this process wrote to it comes first
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        buffer.write(data)
        buffer.flush()
    else:
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()


def room_for(stream: IO[str] | None, size: int) -> bool:
    """Whether writing ``size`` bytes to ``stream`` now (after what the program's own
    stream holds) returns at once: a file, memory, /dev/null; a pipe with that much room
    left; a terminal ready for output, for a few lines."""
    if stream is None:
        return True
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # in memory, or closed: never waits
        return True
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return True
    if stat.S_ISFIFO(mode):
        return size + PENDING_MAX <= _pipe_room(fd)
    if stat.S_ISCHR(mode) and not os.isatty(fd):  # /dev/null and the like
        return True
    return size <= TTY_DIRECT_MAX and _ready(fd)  # a terminal, a socket


def _pipe_room(fd: int) -> int:
    """Bytes a write to the pipe takes without waiting, at the least: its free pages (the
    ones partly read or written count as full)."""
    unread = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, unread, True)
        capacity = fcntl.fcntl(fd, 1032)  # F_GETPIPE_SZ
    except OSError:
        return 0
    used = -(-unread[0] // PAGE) + 1
    return max(0, (capacity // PAGE - used - 1) * PAGE)


def _ready(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        return bool(poller.poll(0))
    except OSError:
        return False
