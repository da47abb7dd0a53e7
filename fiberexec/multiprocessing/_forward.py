"""A child's stdout and stderr, sent to its parent where they would otherwise be lost.

A standard library child writes to the terminal its parent has; so does one of ours on the
local backend. One in a container, a pod, a job or on another host writes where nobody
looks, so there (`Process.start` says so in ``FIBEREXEC_MP_OUTPUT``) the child captures
what goes through ``sys.stdout`` and ``sys.stderr`` line by line (`fiberexec._capture`, as
an executor's worker does) and sends the lines to its parent's broker (`_calls.Output`),
which writes them, unprefixed as a stdlib child's, to its own ``sys.stdout`` and
``sys.stderr``:

    print() -> capture: whole lines; a flushed line, or any on stderr, goes at once
               (a budget a second), else within a second; past 256 KiB the writer sends
    exit    -> the streams flushed, what is left sent (lines not ended too), then exit

What a child writes to its file descriptors directly (native code, a subprocess) stays in
the backend's log, which `Process` prints when the child fails.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from fiberexec import _capture
from fiberexec._output import write_to
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._rpc import Endpoint

ENV_OUTPUT = "FIBEREXEC_MP_OUTPUT"  # "forward": this child sends its output to its parent


class Forwarder:
    """Captures this process's ``sys.stdout`` and ``sys.stderr`` and sends their lines to
    the broker at ``endpoint``; one at a time, so lines keep their order."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._sending = threading.Lock()
        self._due = threading.Event()  # a line is held: the thread sends it soon
        self._closed = False
        self.capture = _capture.Capture(send=self.send, wake=self._due.set)
        _capture.install(self.capture)
        threading.Thread(target=self._run, daemon=True, name="fiberexec-mp-output").start()

    def send(self, *, everything: bool = False, timeout: float | None = None) -> None:
        """Send the lines held (``everything``: and those not ended yet)."""
        with self._sending:
            out, err = self.capture.take(everything=everything)
            if not (out or err):
                return
            with contextlib.suppress(Exception):  # the parent is gone: nobody to tell
                self._endpoint.call(calls.Output(len(out)), out + err,
                                    **({} if timeout is None else {"timeout": timeout}))

    def _run(self) -> None:
        """Send lines printed without a flush (held in the streams' buffers) within
        ``Timing.output_age``."""
        while not self._closed:
            self._due.wait(_timing.TIMING.output_age)
            self._due.clear()
            self.capture.flush_streams()
            self.send()

    def finish(self) -> None:
        """The process exits: send what is left, lines not ended yet too."""
        self._closed = True
        self.capture.flush_streams()
        self.send(everything=True, timeout=_timing.TIMING.output_final)


_forwarder: Forwarder | None = None


def start(endpoint: Endpoint) -> None:
    """Forward this process's output to the broker at ``endpoint`` from now on."""
    global _forwarder
    _forwarder = Forwarder(endpoint)


def finish() -> None:
    """Send what this process's output holds (called as it exits)."""
    if _forwarder is not None:
        _forwarder.finish()


def write(stdout: bytes, stderr: bytes) -> None:
    """In the parent: a child's lines, to this process's streams (as they are now)."""
    for stream, data in ((sys.stdout, stdout), (sys.stderr, stderr)):
        if data:
            with contextlib.suppress(Exception):  # a closed stream: as a stdlib child's
                write_to(stream, data)

