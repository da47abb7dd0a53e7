"""An unauthenticated peer never gets a byte unpickled, and the executor keeps working."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fiberexec import FiberExecutor
from fiberexec import _protocol as p
from fiberexec._events import Call
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_local import NetworkLocalBackend


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.mkdir, (str(self.marker),))


class _GatedBackend(NetworkLocalBackend):
    """Local processes on the network link (so both ways in exist), holding worker starts
    until the test has attacked every endpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.specs: list[WorkerSpec] = []
        self.asked = threading.Semaphore(0)  # released as each worker's endpoint is open

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        self.specs.append(spec)
        self.asked.release()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return super().start_worker(spec)


def _attacks(marker: Path) -> list[bytes]:
    evil = pickle.dumps(_Payload(marker))
    hello = p.encode(p.Hello("w0", b"n" * 16, 1, "attacker", b"p" * 32, ""))
    tasks_frame = b"FX\x01\x05" + evil
    return [evil, tasks_frame, b"FX\x01\x06" + evil, os.urandom(64), b"\x00" * 8192, hello]


def test_crafted_pickles_to_every_endpoint_are_never_run(
    make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    backend = _GatedBackend()
    ex = make_executor(2, backend=backend)
    futures = [ex.submit(tasks.square, i) for i in range(10)]
    for _ in range(2):  # workers start in the background: wait until both endpoints listen
        assert backend.asked.acquire(timeout=30)
    conns = [conn for s in ex._pool.shards for conn in _conns(s)]  # type: ignore[union-attr]
    assert len(conns) == 2
    marker = tmp_path / "pwned"
    rejections = _RejectionLog()
    logging.getLogger("fiberexec").addHandler(rejections)
    try:
        for conn in conns:
            address = conn.channel.address
            assert address.startswith("tcp://127.0.0.1:"), "the local backend uses loopback only"
            port = int(address.rsplit(":", 1)[1])
            # (A Hello naming w0 is well formed on w0's link, but its proof is not: it is
            # refused like the rest, with no answer.)
            for frame in _attacks(marker):
                _attack(lambda port=port: socket.create_connection(("127.0.0.1", port), 10),
                        frame,
                        rejections)
            for frame in _attacks(marker):
                _attack(lambda name=conn.channel.local_name: _unix(name), frame, rejections)
    finally:
        logging.getLogger("fiberexec").removeHandler(rejections)
    backend.gate.set()
    assert [f.result(timeout=60) for f in futures] == [i * i for i in range(10)]
    assert not marker.exists()
    # every attack on each of the two workers' channels, over the network and locally
    assert ex.stats().messages_rejected == 2 * 2 * len(_attacks(marker))


def _unix(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect("\0" + name)
    return sock


def _attack(connected: Callable[[], socket.socket], frame: bytes,
            rejections: _RejectionLog) -> None:
    """``frame`` sent to a way in (the network's TCP port, or the local link): rejected,
    and the peer hung up on. The attacker stays connected until then: closing a socket
    right after sending may drop the frame in flight."""
    with connected() as attacker:
        attacker.settimeout(10)
        seen = rejections.count
        attacker.sendall(struct.pack("!I", len(frame)) + frame)
        assert rejections.wait_beyond(seen, timeout=10), f"{frame[:16]!r} was not rejected"
        assert attacker.recv(100) == b"", "the shard kept a rejected local peer connected"


def test_the_local_backend_listens_on_no_network_port(executor: FiberExecutor) -> None:
    """Its workers all reach the executor's local socket: nothing listens on the network."""
    import psutil

    before = {c.laddr for c in psutil.Process().net_connections(kind="inet")
              if c.status == psutil.CONN_LISTEN}
    assert sorted(executor.map(tasks.sleep_pid, [0.2] * 8, timeout=60))  # both workers up
    conns = [c for s in executor._pool.shards for c in _conns(s)]  # type: ignore[union-attr]
    assert len(conns) == 2
    assert all(c.channel.address == "" and c.channel.kind == "unix" for c in conns)
    after = {c.laddr for c in psutil.Process().net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN}
    assert after <= before


class _RejectionLog(logging.Handler):
    """Counts the shards' "rejected a message" records and lets a test wait for the next one."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("rejected a message"):
            with self._changed:
                self.count += 1
                self._changed.notify_all()

    def wait_beyond(self, seen: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count > seen, timeout)


def _conns(shard: Any) -> list[Any]:
    done = threading.Event()
    shard.post(Call(done.set))
    assert done.wait(10)
    return list(shard.conns.values())


def test_worker_with_wrong_secret_is_refused(tmp_path: Path) -> None:
    ex = FiberExecutor(1, backend=_WrongSecretBackend(), start_timeout=5, heartbeat=0.5)
    try:
        with pytest.raises(Exception, match="failed to start"):
            ex.submit(tasks.square, 2).result(timeout=60)
    finally:
        ex.shutdown()


class _WrongSecretBackend(LocalBackend):
    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        forged = {k: "00" * 32 for k in spec.secret_env}
        return super().start_worker(
            WorkerSpec(**{**spec.__dict__, "secret_env": forged})
        )
