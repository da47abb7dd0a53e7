"""The test bed itself: isolated hosts, and faults that do what they say."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testbed.netns import BedError, TestBed, run
from tests.testbed.session import ROOT, Lab
from tests.testbed.sshd import _wait_for_line

PROBE_PORT = 9000


@contextlib.contextmanager
def probe_server(lab: Lab, host: str, kind: str) -> Iterator[str]:
    """Run a probe server in ``host``; yield its address."""
    address = lab.bed.hosts[host].address
    proc = subprocess.Popen(
        lab.bed.exec_argv(host, [sys.executable, "-m", "tests.testbed.probes", kind, address,
                                 str(PROBE_PORT)]),
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        proc.stderr = proc.stdout
        _wait_for_line(proc, "ready", 20, f"probe {kind}")
        yield address
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def ssh_banner(address: str, timeout: float) -> bytes:
    with socket.create_connection((address, 22), timeout=timeout) as conn:
        return conn.recv(64)


def test_hosts_see_only_the_test_subnet(lab: Lab) -> None:
    for host in lab.bed.hosts.values():
        routes = run(["ip", "-n", host.netns, "-4", "route", "show"]).strip().splitlines()
        assert len(routes) == 1 and routes[0].startswith("10.99.0.0/24 dev eth0"), routes
        addresses = run(["ip", "-n", host.netns, "-o", "addr", "show"])
        assert "inet6" not in addresses
        inet = [w for line in addresses.splitlines() for w in line.split()[3:4]]
        assert sorted(inet) == sorted(["127.0.0.1/8", f"{host.address}/24"])
    bridge = run(["ip", "-n", lab.bed.bridge, "-o", "addr", "show"])
    assert "inet " not in bridge.replace("inet 127.0.0.1/8", "")
    outside = lab.bed.outside_fd
    root_links = subprocess.run(
        ["nsenter", f"--net=/proc/self/fd/{outside}", "ip", "-o", "link", "show"],
        pass_fds=(outside,), capture_output=True, text=True, timeout=30, check=True).stdout
    assert " lo:" in root_links  # we did look at the machine's own namespace
    assert not any(f" {h}@" in root_links for h in lab.bed.hosts), "a test-bed link in root"


def test_this_process_lives_on_the_executor_host(lab: Lab) -> None:
    assert os.stat("/proc/thread-self/ns/net").st_ino == lab.bed.inode("ex")
    for host in lab.bed.worker_hosts:
        assert ssh_banner(host.address, timeout=5).startswith(b"SSH-2.0-")


def test_cut_link_drops_traffic_until_healed(lab: Lab) -> None:
    w1 = lab.bed.hosts["w1"].address
    assert ssh_banner(w1, timeout=5).startswith(b"SSH-2.0-")
    lab.cut("w1")
    with pytest.raises(OSError):  # socket.timeout is an OSError
        ssh_banner(w1, timeout=1.0)
    assert ssh_banner(lab.bed.hosts["w2"].address, timeout=5)  # the others are unaffected
    lab.heal("w1")
    assert ssh_banner(w1, timeout=10).startswith(b"SSH-2.0-")


def _echoed(address: str, count: int) -> int:
    """Send ``count`` datagrams; return how many came back (waiting 1 s after the last)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.connect((address, PROBE_PORT))
        got: set[int] = set()

        def receive() -> None:
            sock.settimeout(1.0)
            with contextlib.suppress(TimeoutError):
                while True:
                    got.add(int(sock.recv(64)))

        reader = threading.Thread(target=receive)
        reader.start()
        for i in range(count):
            sock.send(str(i).encode())
        reader.join(timeout=30)
        return len(got)


def test_loss_drops_about_the_share_asked_for(lab: Lab) -> None:
    with probe_server(lab, "w1", "udp-echo") as address:
        assert _echoed(address, 1000) == 1000  # lossless without a rule
        lab.bed.loss("w1", 20)  # both directions: a round trip survives with 0.8 * 0.8
        survived = _echoed(address, 2000) / 2000
        lab.bed.clear_loss("w1")
        assert 0.56 <= survived <= 0.72, survived
        assert _echoed(address, 1000) == 1000


def _send_bytes(address: str, size: int) -> float:
    start = time.perf_counter()
    with socket.create_connection((address, PROBE_PORT), timeout=30) as conn:
        conn.sendall(b"\0" * size)
        conn.shutdown(socket.SHUT_WR)
        assert int(conn.recv(64)) == size
    return time.perf_counter() - start


def test_rate_limit_caps_throughput(lab: Lab) -> None:
    with probe_server(lab, "w1", "tcp-sink") as address:
        lab.bed.rate("w1", "100mbit")
        size = 5 * 10**6
        rate = size * 8 / _send_bytes(address, size)
        lab.bed.clear_rate("w1")
        assert 0.6e8 <= rate <= 1.08e8, f"{rate / 1e6:.1f} Mbit/s through a 100 Mbit/s tbf"


def test_relay_adds_the_delay_each_way(lab: Lab) -> None:
    direct = lab.rtt("w1")
    with lab.delay(0.005):
        delayed = lab.rtt("w1")
    assert direct < 0.003, direct
    assert 0.010 <= delayed <= 0.010 + direct + 0.004, (direct, delayed)


def test_namespaces_are_removed_even_when_building_fails() -> None:
    def listed() -> str:
        return run(["ip", "netns", "list"])

    bed = TestBed(workers=1, tag=f"{os.getpid()}-t")
    bed.create()
    names = bed.names()
    assert all(n in listed() for n in names) and len(names) == 3
    bed.destroy()
    assert not any(n in listed() for n in names)
    blocker = f"fxtb-{os.getpid()}-u-w1"  # the w1 namespace already exists: building fails
    run(["ip", "netns", "add", blocker])
    try:
        broken = TestBed(workers=1, tag=f"{os.getpid()}-u")
        with pytest.raises(BedError, match="netns add"):
            broken.create()
        assert [n for n in listed().split() if n.startswith(f"fxtb-{os.getpid()}-u")] == [blocker]
    finally:
        run(["ip", "netns", "delete", blocker])
    assert not Path(f"/run/netns/{blocker}").exists()
