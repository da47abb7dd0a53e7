"""The forking launcher's gate: children it forks back to back, past a burst's first
few, start together.

The launcher process is started here as `fiberexec._launcher.Launcher` starts it; requests
written to its socket before it starts are all waiting when it looks, as a burst from an
executor's many starting threads would be.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fiberexec import _launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = "tests.launched_child"  # prints its pid and its launcher's children as it starts


class Launched:
    """A launcher process, the pipe its children print to, and the children's pidfds."""

    def __init__(self) -> None:
        self.sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.out, self._write_end = os.pipe()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfds: list[int] = []
        self.pids: list[int] = []  # in the order the launcher forked them
        self._text = b""

    def start(self) -> None:
        fd = self._theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fiberexec.worker", _launcher.LAUNCHER_FLAG, str(fd)],
            pass_fds=(fd,), cwd=ROOT, stdin=subprocess.DEVNULL, process_group=0)

    def ask(self, *, burst: bool) -> None:
        """Ask for a child (``burst``: amid others, as `Launcher.spawn` says)."""
        request = _launcher.spawn_request({}, [], ROOT, None, None, PROGRAM, None, burst=burst)
        socket.send_fds(self.sock, [request], [self._write_end, self._write_end])

    def replies(self, count: int) -> None:
        for _ in range(count):
            assert select.select([self.sock], [], [], 30)[0], "the launcher did not answer"
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 1)
            reply = pickle.loads(data)
            assert reply[0] == "spawned"
            self.pids.append(reply[1])
            self.pidfds.extend(fds)

    def started(self, count: int) -> dict[int, int]:
        """As the next ``count`` children started: how many children the launcher had, by
        the child's pid."""
        while self._text.count(b"\n") < count:
            assert select.select([self.out], [], [], 30)[0], f"started: {self._text!r}"
            self._text += os.read(self.out, 4096)
        lines = self._text.split(b"\n")
        self._text = b"\n".join(lines[count:])
        return {int(line.split()[0]): int(line.split()[1]) for line in lines[:count]}

    def close(self) -> None:
        for pidfd in self.pidfds:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        self.sock.close()  # the launcher exits when its socket closes
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self._theirs.close()
        os.close(self.out)
        os.close(self._write_end)


@pytest.fixture
def launched() -> Iterator[Launched]:
    made = Launched()
    yield made
    made.close()


def test_children_past_a_burst_s_first_few_start_once_the_last_is_forked(
        launched: Launched) -> None:
    """Twelve requests waiting at once: the children after the first `GATE_BATCH` run only
    once the twelfth is forked (each sees all twelve), so the launcher forks them without
    sharing the CPU with them."""
    count = _launcher.GATE_BATCH + 4
    for _ in range(count):
        launched.ask(burst=True)
    launched.start()
    launched.replies(count)
    seen = launched.started(count)
    assert [seen[pid] for pid in launched.pids[_launcher.GATE_BATCH:]] == [count] * 4


def test_a_burst_s_first_children_start_at_once(launched: Launched) -> None:
    """A small pool's children are not held: they run while the launcher, stopped here
    after forking them, could open no gate (a pool's first worker does not wait for the
    fork of its second)."""
    for _ in range(_launcher.GATE_BATCH):
        launched.ask(burst=True)
    launched.start()
    launched.replies(_launcher.GATE_BATCH)
    assert launched.proc is not None
    launched.proc.send_signal(signal.SIGSTOP)
    try:
        assert sorted(launched.started(_launcher.GATE_BATCH)) == sorted(launched.pids)
    finally:
        launched.proc.send_signal(signal.SIGCONT)


def test_a_child_forked_unheld_while_others_wait_does_not_keep_them_waiting(
        launched: Launched) -> None:
    """A lone request served while a burst's last children wait at the gate: its child,
    which does not wait, inherits the gate's write end with the launcher's descriptors; it
    closes it, so the others still start when the gate opens (had it kept it, they would
    have waited as long as it lives)."""
    count = _launcher.GATE_BATCH + 2
    for _ in range(count):
        launched.ask(burst=True)
    launched.ask(burst=False)  # served next, while the last two wait
    launched.start()
    launched.replies(count + 1)
    assert sorted(launched.started(count + 1)) == sorted(launched.pids)


def test_a_child_asked_for_alone_or_last_is_not_held(launched: Launched) -> None:
    """A lone request (a `Process`, a replacement) starts its child at once; the last of
    a burst starts once no request has followed it for a moment."""
    launched.start()
    launched.ask(burst=False)
    launched.replies(1)
    assert list(launched.started(1).values()) == [1]
    count = _launcher.GATE_BATCH + 2  # enough that the gate waits for more
    for _ in range(count):  # each said to come amid others; then none comes
        launched.ask(burst=True)
        launched.replies(1)
    assert max(launched.started(count).values()) == count + 1
