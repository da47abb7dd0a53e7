"""A real OpenSSH server in each worker host, with keys made for this test run only.

`SSHSite.create` makes, in a private temporary directory: a client key (no passphrase), one
host key per worker host, ``authorized_keys``, a ``known_hosts`` naming each host's key (so
``StrictHostKeyChecking yes`` holds), an ``ssh_config`` for the client, and per host an
``sshd_config``; then starts ``/usr/sbin/sshd -D -e`` inside each host's namespace and waits
until it says it listens. `stop` terminates the daemons; nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import reap
from tests.testbed.netns import BedError, TestBed, run

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 20.0

_SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {hostkey}
AuthorizedKeysFile {authorized}
PidFile none
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 200:30:400
MaxSessions 200
ClientAliveInterval 2
ClientAliveCountMax 3
LogLevel INFO
"""

_CLIENT_CONFIG = """\
Host *
    User {user}
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    LogLevel ERROR
"""


@dataclass
class SSHSite:
    """Keys, configuration and one sshd per worker host of ``bed``."""

    bed: TestBed
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fxtb-ssh-")))
    daemons: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    user: str = "root"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def target(self, short: str) -> str:
        return f"{self.user}@{self.bed.hosts[short].address}"

    def create(self) -> None:
        try:
            self._keys()
            for host in self.bed.worker_hosts:
                self._start(host.name)
        except BaseException:
            self.stop()
            raise

    def _keys(self) -> None:
        os.chmod(self.root, 0o700)
        _keygen(self.client_key, "fiberexec test client")
        (self.root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        lines = []
        for host in self.bed.worker_hosts:
            key = self.root / f"hostkey_{host.name}"
            _keygen(key, f"host {host.name}")
            kind, blob = Path(f"{key}.pub").read_text().split()[:2]
            lines.append(f"{host.address} {kind} {blob}\n")
        self.known_hosts.write_text("".join(lines))
        self.ssh_config.write_text(_CLIENT_CONFIG.format(
            user=self.user, key=self.client_key, known=self.known_hosts))

    def _start(self, short: str) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        config = self.root / f"sshd_config_{short}"
        config.write_text(_SSHD_CONFIG.format(
            address=self.bed.hosts[short].address, hostkey=self.root / f"hostkey_{short}",
            authorized=self.root / "authorized_keys"))
        # `ip netns exec` gives the host a mount namespace of its own; a private /dev/shm
        # there keeps workers from taking the shared-memory shortcut to the executor, as on
        # a separate machine.
        script = (f"mount -t tmpfs -o mode=1777,size=512m fxtb-shm /dev/shm && "
                  f"exec {SSHD} -D -e -f {config}")
        proc = subprocess.Popen(
            self.bed.exec_argv(short, ["sh", "-c", script]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )
        self.daemons[short] = proc
        _wait_for_line(proc, "Server listening on", START_TIMEOUT, f"sshd in {short}")
        log = self.root / f"sshd_{short}.log"
        threading.Thread(target=_drain, args=(proc, log), name=f"sshd-{short}-log",
                         daemon=True).start()

    def log(self, short: str) -> str:
        path = self.root / f"sshd_{short}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for proc in self.daemons.values():
            if proc.poll() is None:
                proc.terminate()
            reap(proc, 10)
            if proc.stderr is not None:
                proc.stderr.close()
        self.daemons.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _drain(proc: subprocess.Popen[str], path: Path) -> None:
    """Keep reading the daemon's log so it never blocks on a full pipe; keep it in a file."""
    assert proc.stderr is not None
    with contextlib.suppress(OSError, ValueError), path.open("a") as out:
        for line in proc.stderr:
            out.write(line)
            out.flush()


def _keygen(path: Path, comment: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float, what: str) -> None:
    """Read ``proc``'s stderr until a line contains ``needle``; raise if it exits or times out."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return
    proc.kill()
    proc.wait(timeout=10)
    raise BedError(f"{what} did not start within {timeout}s: {''.join(seen)[-2000:]}")
