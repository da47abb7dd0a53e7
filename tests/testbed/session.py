"""One test bed per test run, shared by the fixtures and the SSH backend's test kit.

`shared()` builds it on first use (namespaces, sshd in each worker host, this thread moved
into the executor host) and removes it when the last user leaves, also when a test failed.
It fails loudly, never skips, when the machine cannot host it (not root, no ``ip``/``sshd``:
run ``scripts/ssh-testbed.sh install``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path

from tests.support.procs import reap
from tests.testbed.netns import BedError, TestBed, run, stale_namespaces
from tests.testbed.sshd import SSHD, SSHSite, _wait_for_line

ROOT = Path(__file__).resolve().parents[2]
RELAY_PORT = 7000
WORKER_HOSTS = 3


@dataclass
class Lab:
    """The test bed of this run: hosts, their sshd, and faults to apply from a test."""

    bed: TestBed
    site: SSHSite
    _relay: subprocess.Popen[str] | None = field(default=None, repr=False)

    @property
    def executor_address(self) -> str:
        return self.bed.executor.address

    def targets(self) -> list[str]:
        """``root@10.99.0.11`` ... for every worker host."""
        return [self.site.target(h.name) for h in self.bed.worker_hosts]

    def cut(self, short: str) -> None:
        self.bed.cut(short)

    def heal(self, short: str) -> None:
        self.bed.heal(short)

    @contextlib.contextmanager
    def delay(self, seconds: float) -> Iterator[None]:
        """Delay every TCP connection into the executor host by ``seconds`` each way."""
        ex = self.bed.executor
        self._relay = subprocess.Popen(
            self.bed.exec_argv("ex", [sys.executable, "-m", "tests.testbed.relay",
                                      "--listen", f"{ex.address}:{RELAY_PORT}",
                                      "--delay", str(seconds)]),
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            self._relay.stderr = self._relay.stdout  # _wait_for_line reads "stderr"
            _wait_for_line(self._relay, "relay listening", 20.0, "the delaying relay")
            run(["ip", "netns", "exec", ex.netns, "nft", "-f", "-"],
                input=_REDIRECT.format(port=RELAY_PORT))
            yield
        finally:
            with contextlib.suppress(BedError):
                run(["ip", "netns", "exec", ex.netns, "nft", "delete", "table", "ip", "fxtbdelay"])
            self._stop_relay()

    def _stop_relay(self) -> None:
        relay, self._relay = self._relay, None
        if relay is None:
            return
        if relay.stdin is not None:
            relay.stdin.close()
        relay.terminate()
        reap(relay, 10)
        if relay.stdout is not None:
            relay.stdout.close()

    def rtt(self, short: str, count: int = 50) -> float:
        """Median TCP round trip, seconds, from host ``short`` to a server on the executor
        host (through the relay when one is in place), one byte each way."""
        server = socket.create_server((self.executor_address, 0))
        port = server.getsockname()[1]

        def echo() -> None:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while data := conn.recv(64):
                    conn.sendall(data)

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        try:
            out = run(self.bed.exec_argv(short, [
                sys.executable, "-m", "tests.testbed.probes", "tcp-pingpong",
                self.executor_address, str(port), str(count)]), timeout=60)
        finally:
            server.close()
        thread.join(timeout=10)
        return float(out.strip())

    def reset(self) -> None:
        self._stop_relay()
        self.bed.reset()


_REDIRECT = """
table ip fxtbdelay {{
    chain pre {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "eth0" meta l4proto tcp redirect to :{port}
    }}
}}
"""

_lock = threading.Lock()
_users = 0
_lab: Lab | None = None
_leave: contextlib.ExitStack | None = None


def _preflight() -> None:
    if os.geteuid() != 0:
        raise BedError("the multi-host test bed needs root (ip netns, sshd); run as root")
    missing = [tool for tool in ("ip", "tc", "nft", "ssh", "ssh-keygen", "sysctl", "unshare",
                                 "nsenter")
               if shutil.which(tool) is None]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if missing:
        raise BedError(f"the test bed needs {missing}; run scripts/ssh-testbed.sh install")
    for name in stale_namespaces():  # left by a run that was killed: sweep it
        with contextlib.suppress(BedError):
            for pid in run(["ip", "netns", "pids", name]).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            run(["ip", "netns", "delete", name])


def _build() -> tuple[Lab, contextlib.ExitStack]:
    _preflight()
    stack = contextlib.ExitStack()
    try:
        bed = TestBed(workers=WORKER_HOSTS)
        bed.create()
        stack.callback(bed.destroy)
        site = SSHSite(bed)
        site.create()
        stack.callback(site.stop)
        lab = Lab(bed, site)
        stack.callback(lab.reset)
        # The stdlib's resource tracker, a child that outlives the bed, starts out here: one
        # started inside would be killed with the bed, and the run's last unregistrations
        # would then meet a new tracker that never saw the names (a traceback each).
        resource_tracker.ensure_running()
        stack.enter_context(bed.enter("ex"))  # this thread now lives on the executor host
    except BaseException:
        stack.close()
        raise
    return lab, stack


@contextlib.contextmanager
def shared() -> Iterator[Lab]:
    """The run's `Lab`, built on first entry and removed when the last user leaves."""
    global _users, _lab, _leave
    with _lock:
        if _lab is None:
            _lab, _leave = _build()
        _users += 1
        lab = _lab
    try:
        yield lab
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _leave is not None:
                leave, _lab, _leave = _leave, None, None
                leave.close()
