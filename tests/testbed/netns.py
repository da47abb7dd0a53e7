"""Linux network namespaces as hosts: an executor host and worker hosts on one bridge.

::

    fxtb-<pid>-ex (10.99.0.1)  --veth--+
    fxtb-<pid>-w1 (10.99.0.11) --veth--+-- br0 in fxtb-<pid>-br (no address, no route)
    fxtb-<pid>-w2 (10.99.0.12) --veth--+
    ...

Every host has one interface (``eth0``) with one address in 10.99.0.0/24, a route to that
subnet only and no default route, and IPv6 disabled, so nothing it sends can leave the test
bed; the bridge namespace has no address at all. Nothing links to the root namespace.

Faults are applied on the bridge side of a host's link, as if at the switch:

- `cut`/`heal`: the switch port goes down/up (``ip link set``);
- `loss`: an nftables rule in the bridge's forward hook drops frames entering or leaving the
  port at random (``numgen random``);
- `rate`: a ``tbf`` qdisc shapes the port's egress and the host's own egress;
- delay: the kernel here has no ``netem`` qdisc, so `tests.testbed.relay` delays TCP
  connections into the executor host instead (see there: it delays per segment it reads,
  not per packet).

`enter` moves the calling thread into a host's namespace (``setns(2)`` applies to one
thread); threads and processes it creates afterwards start there too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fxtb"
SUBNET = "10.99.0"
CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT = 30.0


class BedError(RuntimeError):
    """The test bed could not be built or changed; the message has the command's output."""


def run(argv: Sequence[str], *, input: str | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
    """Run a command, raise `BedError` with its output if it fails; return its stdout."""
    try:
        done = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BedError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise BedError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    name: str  # short: "ex", "w1"
    netns: str  # the namespace's full name
    address: str


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise BedError(f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@dataclass
class TestBed:
    """The namespaces of one test run; `create` builds them, `destroy` removes them."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    workers: int = 3
    tag: str = field(default_factory=lambda: str(os.getpid()))
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    _created: list[str] = field(default_factory=list)
    _lossy: set[str] = field(default_factory=set)
    outside_fd: int = -1  # while inside: the namespace this thread came from

    @property
    def executor(self) -> Host:
        return self.hosts["ex"]

    @property
    def worker_hosts(self) -> list[Host]:
        return [h for n, h in self.hosts.items() if n != "ex"]

    def _ns(self, short: str) -> str:
        return f"{PREFIX}-{self.tag}-{short}"

    # ---------------------------------------------------------------- building

    def create(self) -> None:
        """Build the bridge and every host; on any failure remove what was built, and raise."""
        try:
            self.bridge = self._add_ns("br")
            self._ip(self.bridge, "link", "add", "br0", "type", "bridge", "forward_delay", "0",
                     "stp_state", "0")
            self._ip(self.bridge, "link", "set", "br0", "up")
            self._add_host("ex", f"{SUBNET}.1")
            for i in range(1, self.workers + 1):
                self._add_host(f"w{i}", f"{SUBNET}.{10 + i}")
            run(["ip", "netns", "exec", self.bridge, "nft", "-f", "-"], input=_BRIDGE_TABLE)
        except BaseException:
            self.destroy()
            raise

    def _add_ns(self, short: str) -> str:
        name = self._ns(short)
        run(["ip", "netns", "add", name])
        self._created.append(name)
        self._ip(name, "link", "set", "lo", "up")
        run(["ip", "netns", "exec", name, "sysctl", "-q", "-w",
             "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
        return name

    def _add_host(self, short: str, address: str) -> None:
        netns = self._add_ns(short)
        run(["ip", "link", "add", "eth0", "netns", netns, "type", "veth",
             "peer", "name", short, "netns", self.bridge])
        self._ip(self.bridge, "link", "set", short, "master", "br0", "up")
        self._ip(netns, "addr", "add", f"{address}/24", "dev", "eth0")
        self._ip(netns, "link", "set", "eth0", "up")
        self.hosts[short] = Host(short, netns, address)

    @staticmethod
    def _ip(netns: str, *args: str) -> str:
        return run(["ip", "-n", netns, *args])

    def destroy(self) -> None:
        """Kill what still runs in our namespaces and remove them; idempotent."""
        errors = []
        for name in reversed(self._created):
            with contextlib.suppress(BedError):
                for pid in run(["ip", "netns", "pids", name]).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), 9)
            try:
                run(["ip", "netns", "delete", name])
            except BedError as exc:
                errors.append(str(exc))
        self._created.clear()
        if errors:
            raise BedError("; ".join(errors))

    def names(self) -> list[str]:
        return list(self._created)

    # ---------------------------------------------------------------- being inside

    @contextlib.contextmanager
    def enter(self, short: str = "ex") -> Iterator[None]:
        """Run the calling thread (and what it starts) inside host ``short``'s namespace."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.hosts[short].netns}", os.O_RDONLY)
        try:
            setns(target)
            self.outside_fd = own
            yield
        finally:
            setns(own)
            self.outside_fd = -1
            os.close(own)
            os.close(target)

    def exec_argv(self, short: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``short``."""
        return ["ip", "netns", "exec", self.hosts[short].netns, *argv]

    def inode(self, short: str) -> int:
        return Path(f"/run/netns/{self.hosts[short].netns}").stat().st_ino

    # ---------------------------------------------------------------- faults

    def cut(self, short: str) -> None:
        """Pull the host's cable: its switch port goes down."""
        self._ip(self.bridge, "link", "set", short, "down")

    def heal(self, short: str) -> None:
        """Plug the cable back in; neighbour entries that failed meanwhile are forgotten, so
        traffic resumes at once rather than after the kernel's unreachability timeout."""
        self._ip(self.bridge, "link", "set", short, "up")
        for host in self.hosts.values():
            self._ip(host.netns, "neigh", "flush", "dev", "eth0")

    def loss(self, short: str, percent: float) -> None:
        """Drop ``percent`` % of the frames entering and, separately, leaving the host's port."""
        self.clear_loss(short)
        threshold = round(percent * 100)  # numgen draws 0..9999
        for direction in ("iifname", "oifname"):
            run(["ip", "netns", "exec", self.bridge, "nft", "add", "rule", "bridge", "fxtb",
                 "forward", direction, short, "numgen", "random", "mod", "10000", "<",
                 str(threshold), "drop", "comment", f'"loss-{short}"'])
        self._lossy.add(short)

    def clear_loss(self, short: str) -> None:
        if short not in self._lossy:
            return
        listing = run(["ip", "netns", "exec", self.bridge, "nft", "-a", "list", "chain",
                       "bridge", "fxtb", "forward"])
        for line in listing.splitlines():
            if f'"loss-{short}"' in line and "# handle " in line:
                handle = line.rsplit("# handle ", 1)[1].strip()
                run(["ip", "netns", "exec", self.bridge, "nft", "delete", "rule", "bridge",
                     "fxtb", "forward", "handle", handle])
        self._lossy.discard(short)

    def rate(self, short: str, rate: str, *, burst: str = "512kb") -> None:
        """Shape the link both ways to ``rate`` (``tc`` units, e.g. ``"1gbit"``) with ``tbf``."""
        for netns, dev in ((self.bridge, short), (self.hosts[short].netns, "eth0")):
            run(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev, "root",
                 "tbf", "rate", rate, "burst", burst, "latency", "50ms"])

    def clear_rate(self, short: str) -> None:
        for netns, dev in ((self.bridge, short), (self.hosts[short].netns, "eth0")):
            with contextlib.suppress(BedError):  # no qdisc of ours there
                run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", dev, "root"])

    def reset(self) -> None:
        """Every link up, lossless and unshaped."""
        for short in self.hosts:
            self.heal(short)
            self.clear_loss(short)
            self.clear_rate(short)


_BRIDGE_TABLE = """
table bridge fxtb {
    chain forward {
        type filter hook forward priority 0; policy accept;
    }
}
"""


def stale_namespaces() -> list[str]:
    """Test-bed namespaces whose test run (the pid in their name) is gone."""
    out = run(["ip", "netns", "list"])
    stale = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        mine = len(parts) >= 3 and parts[0] == PREFIX and parts[1].isdigit()
        if mine and not Path(f"/proc/{parts[1]}").exists():
            stale.append(name)
    return stale
