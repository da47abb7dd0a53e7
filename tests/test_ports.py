"""Listening ports in a configured range, and enough descriptors for max_workers.

Ports are for the network link: the local processes here are given no local socket
(`NetworkLocalBackend`), so they dial the executor as workers on other hosts do.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import psutil
import pytest

from fiberexec import BrokenFiberExecutor, ConfigurationError, FiberExecutor
from tests import tasks
from tests.support.backend_local import NetworkLocalBackend


def free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive loopback ports that are free right now."""
    for base in range(31000, 60000, 97):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + size):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base, base + size - 1
    raise AssertionError("no free port range on this machine")


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def served_ports() -> set[int]:
    """This process's ends of established TCP connections (a worker's port stops listening
    once the worker is in: its connection stays)."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED}


@pytest.mark.parametrize("value", ["abc", "5-3", "0", "70000", "1-70000", (3, 2)])
def test_bad_ports_are_refused_with_the_rule(value: object) -> None:
    with pytest.raises(ConfigurationError, match="a port like 40000 or a range"):
        FiberExecutor(1, ports=value)  # type: ignore[arg-type]


def test_a_range_smaller_than_max_workers_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="holds 2 ports but max_workers=4"):
        FiberExecutor(4, ports="40000-40001")
    with pytest.raises(ConfigurationError, match=(
            r"ports=40000 \(from the ports= argument\) holds 1 port but max_workers=2 needs "
            r"one per worker; give a range, e.g. 40000-40001, or lower max_workers")):
        FiberExecutor(2, ports=40000)


def test_ports_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIBEREXEC_PORTS", "41000-41009")
    assert FiberExecutor(2)._config.ports == (41000, 41009)


def test_workers_are_served_on_ports_in_the_range() -> None:
    low, high = free_range(4)
    with NetworkLocalBackend() as backend, \
            FiberExecutor(2, backend=backend, ports=f"{low}-{high}") as ex:
        assert list(ex.map(tasks.square, range(20))) == [i * i for i in range(20)]
        assert len(set(ex.map(tasks.sleep_pid, [0.2] * 8, timeout=60))) == 2  # both are in
        used = {p for p in served_ports() if low <= p <= high}
        assert len(used) == 2


@contextlib.contextmanager
def occupied(low: int, high: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for port in range(low, high + 1):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def test_a_full_range_breaks_the_executor_with_the_reason() -> None:
    low, high = free_range(2)
    with occupied(low, high), NetworkLocalBackend() as backend:
        ex = FiberExecutor(2, backend=backend, ports=(low, high))
        future = ex.submit(tasks.square, 3)
        with pytest.raises(BrokenFiberExecutor, match=f"every port of ports={low}-{high}"):
            future.result(timeout=30)
        ex.shutdown()


def _limits_program(soft: int, hard: int, workers: int) -> str:
    return textwrap.dedent(f"""
        import resource
        from fiberexec import _fdlimit
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
        try:
            _fdlimit.ensure({workers})
        except ValueError as exc:
            print("error:", exc)
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """)


def test_soft_descriptor_limit_is_raised_for_max_workers() -> None:
    out = subprocess.run([sys.executable, "-c", _limits_program(256, 8192, 1000)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == [str(4 * 1000 + 128)]


def test_too_low_hard_limit_is_a_clear_error() -> None:
    out = subprocess.run([sys.executable, "-c", _limits_program(256, 512, 1000)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "max_workers=1000 needs about 4128 file descriptors, but the hard limit is 512" in out
    assert out.split()[-1] == "256"
