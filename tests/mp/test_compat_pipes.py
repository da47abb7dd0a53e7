"""Pipes and queues between processes: order, EOF, dead peers, against both modules."""

from __future__ import annotations

import multiprocessing.connection
from types import ModuleType

import pytest

import fiberexec.multiprocessing as fmp
from fiberexec.multiprocessing import _calls as calls
from tests.mp import compat_tasks as t
from tests.mp.compat import mpm

__all__ = ["mpm"]


def test_everything_sent_before_exit_arrives_then_eof(mpm: ModuleType) -> None:
    here, there = mpm.Pipe(duplex=False)
    p = mpm.Process(target=t.send_many_then_exit, args=(there, 200))
    p.start()
    there.close()
    assert [here.recv() for _ in range(200)] == list(range(200))
    with pytest.raises(EOFError):
        here.recv()
    p.join(60)


def test_a_killed_writer_gives_eof_not_a_hang(mpm: ModuleType) -> None:
    here, there = mpm.Pipe()
    p = mpm.Process(target=t.sleep_long, args=())
    p.start()
    p.kill()
    p.join(60)
    writer = mpm.Process(target=t.relay, args=(there, there))
    writer.start()
    there.close()
    writer.kill()  # before or after it unpickled its end: either way the end is released
    writer.join(60)
    assert here.poll(60)
    with pytest.raises(EOFError):
        here.recv()


def test_pipe_between_two_children(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")  # forked children would hold every end open (no EOF)
    a_in, a_out = ctx.Pipe(duplex=False)
    b_in, b_out = ctx.Pipe(duplex=False)
    c_in, c_out = ctx.Pipe(duplex=False)
    first = ctx.Process(target=t.relay, args=(a_in, b_out))
    second = ctx.Process(target=t.relay, args=(b_in, c_out))
    first.start()
    second.start()
    for end in (a_in, b_out, b_in, c_out):
        end.close()
    for i in range(20):
        a_out.send(i)
    a_out.close()
    assert [c_in.recv() for _ in range(20)] == [i * 4 for i in range(20)]
    with pytest.raises(EOFError):
        c_in.recv()
    first.join(60)
    second.join(60)
    assert (first.exitcode, second.exitcode) == (0, 0)


def test_queues_both_ways_keep_order(mpm: ModuleType) -> None:
    to_child, from_child = mpm.Queue(), mpm.Queue()
    p = mpm.Process(target=t.queue_echo, args=(to_child, from_child, 300))
    p.start()
    for i in range(300):
        to_child.put(i)
    assert [from_child.get(timeout=60) for _ in range(300)] == list(range(300))
    p.join(60)
    assert p.exitcode == 0


def test_poll_and_connection_wait_on_the_pipe(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")  # a forked child would hold `here` open too
    here, there = ctx.Pipe()
    p = ctx.Process(target=t.relay, args=(there, there))
    p.start()
    there.close()
    assert not here.poll(0.01)
    here.send(21)
    assert here.poll(60) and here.recv() == 42
    here.close()
    assert multiprocessing.connection.wait([p.sentinel], timeout=60) == [p.sentinel]
    p.join(60)


def test_stream_refuses_a_wrong_key() -> None:
    from fiberexec.multiprocessing import _links
    from fiberexec.multiprocessing._broker import get_broker

    fmp.Pipe()
    broker = get_broker()
    host, port, unix = broker.endpoint.call(calls.OpenStream())[0]
    # one listener for the broker: its streams come where its calls do
    assert (port, unix) == (broker.server.port, broker.server.local_name)
    with pytest.raises(multiprocessing.AuthenticationError, match="does not hold"):
        _links.dial(b"w" * 32, "", (host, port), service=_links.STREAM)
    if unix:  # the same handshake on the Unix socket processes of this host use
        with pytest.raises(multiprocessing.AuthenticationError, match="does not hold"):
            _links.dial(b"w" * 32, unix, service=_links.STREAM)


def test_pipe_ends_have_a_fileno_for_wait_and_selectors(mpm: ModuleType) -> None:
    import selectors

    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    idle, _idle_other = ctx.Pipe()
    p = ctx.Process(target=t.wait_then_double, args=(there,))  # waits in the child
    p.start()
    there.close()
    assert isinstance(here.fileno(), int)
    assert multiprocessing.connection.wait([here, idle], timeout=0.05) == []
    here.send(21)
    assert multiprocessing.connection.wait([here, idle], timeout=60) == [here]
    assert multiprocessing.connection.wait([here], timeout=0) == [here]  # still unread
    assert here.recv() == 42
    assert multiprocessing.connection.wait([here], timeout=0) == []
    with selectors.DefaultSelector() as sel:
        sel.register(here, selectors.EVENT_READ)
        assert sel.select(0.05) == []
        here.send(5)
        assert [key.fileobj for key, _ in sel.select(60)] == [here]
        assert here.recv() == 10
        sel.unregister(here)
    here.close()  # the child sees EOF and exits: its end closes, so ours would see EOF
    p.join(60)
    assert p.exitcode == 0
    reader, writer = ctx.Pipe(duplex=False)
    writer.close()
    assert multiprocessing.connection.wait([reader], timeout=60) == [reader]  # EOF: ready
    with pytest.raises(EOFError):
        reader.recv()
    reader.close()
    with pytest.raises(OSError):
        reader.fileno()


def test_recv_from_a_child_also_wakes_for_a_local_sender(mpm: ModuleType) -> None:
    """The creator's `recv` reads the child's stream itself; an item sent meanwhile by
    another thread here, into the same pipe direction, still ends the wait."""
    import threading

    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=t.relay, args=(there, there))
    p.start()
    here.send(1)
    assert here.recv() == 2  # the last item came from the child
    sender = threading.Timer(0.3, there.send, args=("from a thread here",))
    sender.start()
    assert here.poll(60)
    assert here.recv() == "from a thread here"
    sender.join()
    there.close()
    here.close()
    p.join(60)
    assert p.exitcode == 0


def test_an_answer_awaited_elsewhere_is_not_held_back(mpm: ModuleType) -> None:
    """After a send on a duplex end, the child's stream is kept for this thread to read the
    answer; anything else the child sends meanwhile (here a queue item another thread
    waits for) must still arrive, though this thread never calls `recv`."""
    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    q = ctx.Queue()
    p = ctx.Process(target=t.answer_then_queue, args=(there, q))
    p.start()
    there.close()
    here.send(1)
    assert here.recv() == 2  # from now on, a send here expects the child's answer
    here.send(21)
    assert q.get(timeout=60) == "queued"
    assert here.recv() == 42
    here.close()
    p.join(60)
    assert p.exitcode == 0


def test_queue_item_after_an_answer_is_not_held_back(mpm: ModuleType) -> None:
    """The stream a recv() here just read stays with this thread a moment (for the next
    answer); an item for someone else that comes next still arrives though this thread
    neither sends nor receives again."""
    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    q, go = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=t.answer_then_queue_on_event, args=(there, q, go, 3))
    p.start()
    there.close()
    for i in range(3):  # the first answer may pass through the serving thread; not later
        here.send(i)
        assert here.recv() == 2 * i
    go.set()
    assert q.get(timeout=60) == "queued"
    here.close()
    p.join(60)
    assert p.exitcode == 0


def test_recv_reading_a_child_that_is_killed_ends_in_eof(mpm: ModuleType) -> None:
    import threading

    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    p = ctx.Process(target=t.relay, args=(there, there))
    p.start()
    there.close()
    here.send(1)
    assert here.recv() == 2
    killer = threading.Timer(0.3, p.kill)
    killer.start()
    with pytest.raises(EOFError):
        here.recv()  # blocked reading the child's stream when it dies
    killer.join()
    p.join(60)
