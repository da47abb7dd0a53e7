"""A worker's task output, held line by line until it travels to the executor.

    task thread: print() -> sys.stdout (TextIOWrapper, 64 KiB buffer) -> _Stream.write
                 -> Capture.write: complete lines held; the first wakes the outbox
    outbox: flushes the streams before each result and at least every OUTPUT_AGE, then
            Capture.take() -> Heartbeat(stdout, stderr), before any result that follows;
            past SEND_AT bytes the writing thread sends them itself (so a task printing
            fast waits on the link, and nothing is dropped)
    a flush that brings whole lines (``print(..., flush=True)``, any line on stderr) is
            sent by the writing thread at once, up to PROMPT_BURST messages and then
            PROMPT_RATE a second: a task's last words before it crashes its worker, and
            a line printed before a long call into C, are not held back in the worker;
            a task printing in a tight loop shares messages as before

The buffer makes a print cost what it costs into a file (a line-buffered capture cost 5
times more); stderr stays line-buffered, as Python's own is.

Only what goes through ``sys.stdout`` and ``sys.stderr`` is captured (print, logging,
warnings, progress bars); a file descriptor written directly (native code, a subprocess)
still reaches the worker's own output, which the backend keeps (`Backend.logs`).
"""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
import time
from collections.abc import Callable

STDOUT, STDERR = 1, 2
SEND_AT = 256 << 10  # bytes held before the writing thread sends them itself
LONG_LINE = 1 << 20  # a line without its end yet, longer than this, goes in pieces
PROMPT_BURST = 100  # flushed lines sent at once, before PROMPT_RATE applies
PROMPT_RATE = 20.0  # flushed lines sent at once per second, on average, after the burst
BUFFER = 64 << 10  # bytes a task's stdout holds before they reach the capture


class Capture:
    """Complete lines written to each stream, held until `take`."""

    def __init__(self, send: Callable[[], None], wake: Callable[[], None],
                 prefix: bytes = b"") -> None:
        self._send = send  # sends what is held (called without the lock held)
        self._wake = wake  # the first line is held: the outbox should send it soon
        self._prefix = prefix  # put before every line (here: the executor does no per-line work)
        self._lock = threading.Lock()
        self._held: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
        # A line not ended yet, in the pieces written (joined once it ends), and its length
        self._partial: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
        self._partial_size = {STDOUT: 0, STDERR: 0}
        self._cut = {STDOUT: False, STDERR: False}  # a long line was cut: drop its newline
        self._prompt = float(PROMPT_BURST)  # messages that may be sent at once now
        self._prompt_at = time.monotonic()
        self.size = 0  # bytes held in complete lines
        self.since: float | None = None  # when the oldest held line came
        self.streams: tuple[io.TextIOBase, ...] = ()  # the sys.stdout and sys.stderr it feeds

    def flush_streams(self) -> None:
        """Push what the task wrote through the streams' buffers into this capture."""
        for stream in self.streams:
            try:
                stream.flush()
            except (OSError, ValueError):  # closed by the task: nothing more comes from it
                pass

    def write(self, stream: int, data: bytes) -> None:
        """Take what a stream's flush brought: whole lines are held, and sent at once
        while the prompt budget lasts; a line's start waits for its end."""
        with self._lock:
            if self._cut[stream]:
                self._cut[stream] = False
                if data.startswith(b"\n"):  # the end of a line already sent in pieces
                    data = data[1:]
            end = data.rfind(b"\n") + 1
            pieces, partial = self._partial[stream], self._partial_size[stream]
            if end:
                pieces.append(data[:end])
                self._hold(stream, b"".join(pieces))
                pieces.clear()
                data, partial = data[end:], 0
            if data:
                pieces.append(data)
                partial += len(data)
                if partial > LONG_LINE:  # goes as a line of its own
                    pieces.append(b"\n")
                    self._hold(stream, b"".join(pieces))
                    pieces.clear()
                    partial, end, self._cut[stream] = 0, 1, True
            self._partial_size[stream] = partial
            first = self.since is None and self.size > 0
            if first:
                self.since = time.monotonic()
            now = bool(end) and self._prompt_now()
        if now or self.size >= SEND_AT:
            self._send()
        elif first:
            self._wake()

    def _hold(self, stream: int, lines: bytes) -> None:
        self._held[stream].append(lines)
        self.size += len(lines)

    def _prompt_now(self) -> bool:
        """(With the lock held) whether whole lines just flushed go at once: a token."""
        now = time.monotonic()
        self._prompt = min(PROMPT_BURST, self._prompt + (now - self._prompt_at) * PROMPT_RATE)
        self._prompt_at = now
        if self._prompt < 1:
            return False
        self._prompt -= 1
        return True

    def end_lines(self) -> None:
        """A task ended: a line it left unfinished is ended here, so it travels with the
        task's other lines, before its result (and the next task's output starts a line of
        its own)."""
        with self._lock:
            self._end_partial_lines()
            if self.size and self.since is None:
                self.since = time.monotonic()

    def _end_partial_lines(self) -> None:
        """(With the lock held) end the lines not ended yet and hold them."""
        for stream, pieces in self._partial.items():
            if pieces:
                pieces.append(b"\n")
                self._hold(stream, b"".join(pieces))
                pieces.clear()
                self._partial_size[stream] = 0

    def take(self, *, everything: bool = False) -> tuple[bytes, bytes]:
        """What is held, as (stdout, stderr) bytes of whole lines; ``everything`` adds
        the lines not ended yet (the worker is leaving)."""
        with self._lock:
            if everything:
                self._end_partial_lines()
            out, err = (b"".join(self._held[STDOUT]), b"".join(self._held[STDERR]))
            self._held[STDOUT].clear()
            self._held[STDERR].clear()
            self.size, self.since = 0, None
        return self._prefixed(out), self._prefixed(err)

    def _prefixed(self, lines: bytes) -> bytes:
        prefix = self._prefix
        if not prefix or not lines:
            return lines
        return prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"


class _Stream(io.RawIOBase):
    """The binary end of a captured ``sys.stdout`` or ``sys.stderr``."""

    def __init__(self, capture: Capture, stream: int) -> None:
        super().__init__()
        self._capture, self._stream = capture, stream

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._capture.write(self._stream, bytes(data))
        return len(data)

    def fileno(self) -> int:  # the worker's own descriptor: what uses it is not captured
        return self._stream


def _escape_bytes(error: UnicodeError) -> tuple[str | bytes, int]:
    """The encoding's error handler of captured output: a byte a task decoded with
    ``surrogateescape`` (a file name, binary junk) goes out as that byte, as it would to a
    terminal of the standard library's worker; any other character that cannot be encoded
    as its escape, where the task would otherwise fail for printing it."""
    try:
        return _SURROGATEESCAPE(error)
    except UnicodeError:
        return codecs.backslashreplace_errors(error)


_SURROGATEESCAPE = codecs.lookup_error("surrogateescape")
codecs.register_error("fiberexec.output", _escape_bytes)


def install(capture: Capture | None) -> None:
    """Point ``sys.stdout`` and ``sys.stderr`` at ``capture``, or at nothing (None)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if capture is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # for the process's lifetime
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
        return
    out, err = (
        io.TextIOWrapper(io.BufferedWriter(_Stream(capture, stream), BUFFER),  # type: ignore[type-var]
                         encoding="utf-8",
                         errors="fiberexec.output", line_buffering=stream == STDERR)
        for stream in (STDOUT, STDERR)
    )
    capture.streams = (out, err)
    sys.stdout, sys.stderr = out, err
