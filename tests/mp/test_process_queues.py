"""Process, Queue, JoinableQueue, SimpleQueue and Pipe against the stdlib's behaviour."""

from __future__ import annotations

import contextlib
import queue
import select
import signal
import socket
import struct
from types import ModuleType

import pytest

import fiberexec.multiprocessing as mp
from tests.mp import tasks
from tests.mp.compat import links_shaped, mpm  # noqa: F401  # (mpm: a fixture)
from tests.support.kit import BackendKit

BIG = 100 << 20


def test_process_runs_target_and_reports_pid() -> None:
    q = mp.Queue()
    p = mp.Process(target=tasks.put_pid, args=(q,))
    assert p.exitcode is None and not p.is_alive() and p.pid is None
    p.start()
    assert q.get(timeout=60) == p.pid
    p.join(60)
    assert p.exitcode == 0 and not p.is_alive()
    assert p not in mp.active_children()
    p.close()
    with pytest.raises(ValueError):
        p.is_alive()


def test_subclass_run_and_name() -> None:
    q = mp.Queue()
    p = tasks.Subclass(q)
    p.name = "worker-a"
    p.start()
    assert q.get(timeout=60)[0] == "worker-a"
    p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize(("code", "expected"), [(None, 0), (3, 3), ("message", 1)])
def test_exit_codes(code: object, expected: int) -> None:
    p = mp.Process(target=tasks.exit_with, args=(code,))
    p.start()
    p.join(60)
    assert p.exitcode == expected


def test_exception_gives_exit_code_1_and_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    p = mp.Process(target=tasks.fail, args=("target",))
    p.start()
    p.join(60)
    assert p.exitcode == 1
    assert "ValueError: bad target" in capfd.readouterr().err


@pytest.mark.parametrize(("method", "sig"), [("terminate", signal.SIGTERM),
                                              ("kill", signal.SIGKILL)])
def test_terminate_and_kill_give_negative_signal(method: str, sig: int) -> None:
    p = mp.Process(target=tasks.sleep_forever, daemon=True)
    p.start()
    assert p.is_alive() and p.daemon
    getattr(p, method)()
    p.join(60)
    assert p.exitcode == -sig


def test_sentinel_becomes_readable_and_join_timeout() -> None:
    p = mp.Process(target=tasks.sleep_forever)
    p.start()
    p.join(timeout=0.05)
    assert p.is_alive()
    assert select.select([p.sentinel], [], [], 0)[0] == []
    p.kill()
    assert select.select([p.sentinel], [], [], 60)[0] == [p.sentinel]
    p.join(60)


def test_queue_semantics_in_parent() -> None:
    q = mp.Queue(maxsize=1)
    assert q.empty() and q.qsize() == 0
    q.put("a")
    assert q.full()
    with pytest.raises(queue.Full):
        q.put("b", timeout=0.05)
    with pytest.raises(queue.Full):
        q.put_nowait("b")
    assert q.get() == "a"
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    sq = mp.SimpleQueue()
    sq.put([1])
    assert not sq.empty() and sq.get() == [1]


def test_queues_with_pool_workers_and_joinable() -> None:
    inq, outq = mp.JoinableQueue(), mp.Queue()
    with mp.Pool(2) as pool:
        running = pool.apply_async(tasks.consume, (inq, outq))
        for i in range(5):
            inq.put(i)
        inq.put(None)
        assert inq.join(timeout=60)
        assert sorted(outq.get(timeout=10) for _ in range(5)) == [0, 2, 4, 6, 8]
        running.get(60)
    with pytest.raises(ValueError, match="too many"):
        inq.task_done()


def test_pipe_between_parent_and_process_with_eof() -> None:
    here, there = mp.Pipe()
    p = mp.Process(target=tasks.echo_pipe, args=(there,))
    p.start()
    there.close()
    here.send({"x": 1})
    assert here.poll(60) and here.recv() == {"x": 1}
    here.send_bytes(b"abcdef", 2, 3)
    assert here.recv_bytes() == b"cde"
    here.send_bytes(b"xyz")
    buf = bytearray(2)
    with pytest.raises(mp.BufferTooShort):
        here.recv_bytes_into(buf)
    here.close()
    p.join(60)
    assert p.exitcode == 0


def test_one_way_pipe_and_eof() -> None:
    reader, writer = mp.Pipe(duplex=False)
    assert reader.readable and not reader.writable
    with pytest.raises(OSError):
        reader.send(1)
    assert not reader.poll(0.01)
    writer.send(5)
    writer.close()
    assert reader.recv() == 5
    with pytest.raises(EOFError):
        reader.recv()


@pytest.mark.slow
def test_100_mib_through_a_queue_and_a_pipe() -> None:
    data = b"\x00" * (BIG - 1) + b"\x07"
    inq, outq = mp.Queue(), mp.Queue()
    with mp.Pool(1) as pool:
        size = pool.apply_async(tasks.queue_roundtrip, (inq, outq))
        inq.put(data)
        assert outq.get(timeout=60) == data
        assert size.get(60) == BIG
    here, there = mp.Pipe()
    p = mp.Process(target=tasks.big_through_pipe, args=(there, BIG))
    p.start()
    here.send(data)
    assert here.recv() is True
    p.join(60)


def test_a_child_that_ends_at_once_loses_none_of_what_it_put(kit: BackendKit,
                                                              mpm: ModuleType) -> None:  # noqa: F811
    """A child puts items and ends while part of a message of its parent's sits unread in
    its connection. Over TCP (on the ssh test bed) a process that exits so has its connection
    reset, and the kernel drops what it had not yet sent: there, links shaped to 20 Mbit/s
    keep most of its megabyte unsent when it ends, so the test fails unless the child waits
    for its parent to have read it all."""
    with links_shaped(kit, "20mbit"):
        ctx = mpm.get_context("spawn")
        writer, reader = ctx.Pipe()  # (duplex: a socket pair on one host holds the message)
        outq = ctx.Queue()
        p = ctx.Process(target=tasks.read_once_then_put, args=(reader, outq, 16, 1 << 16))
        p.start()
        writer.send("first")
        writer.send_bytes(b"y" * (96 << 10))  # (longer than a read of the child's, which
        # stops at the first message: the rest stays unread in its connection)
        # (read before joining, as the stdlib asks: its child waits to have fed them all)
        assert [outq.get(timeout=30) for _ in range(16)] == [bytes([i]) * (1 << 16)
                                                           for i in range(16)]
        p.join(60)
        assert p.exitcode == 0


def test_wrong_secret_is_refused() -> None:
    from fiberexec.multiprocessing._broker import get_broker
    from fiberexec.multiprocessing._rpc import RpcClient

    broker = get_broker()
    with pytest.raises(mp.AuthenticationError, match="does not hold"):
        RpcClient(broker.address, b"x" * 32, timeout=10)


@pytest.mark.parametrize("opening", [b"R" + b"\x80\x05N." * 4, struct.pack("!Q", 1 << 40)])
def test_a_request_before_authentication_is_rejected_unread(opening: bytes) -> None:
    from fiberexec.multiprocessing._broker import get_broker

    server = get_broker().server
    before = server.rejected
    host, port = server.address[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(opening + bytes(32))  # a request, or a terabyte announced
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread
            assert sock.recv(1) == b""  # closed, nothing read or allocated
    assert server.rejected == before + 1
