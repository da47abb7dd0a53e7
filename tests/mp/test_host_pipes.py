"""Pipes between processes of one host (`_hostpipe`): the standard library's socket pipe,
its ends handed to other processes as descriptors. The behaviour shared with the standard
library runs on both; what is fiberexec's own (which pipe a backend gets, the hand-over) on
ours."""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
from types import ModuleType

import pytest

import fiberexec.multiprocessing as fmp
from fiberexec import _serialize
from fiberexec._errors import SerializationError
from fiberexec._serialize import dumps_bytes, loads_bytes
from fiberexec.multiprocessing import _hostpipe, _timing
from fiberexec.multiprocessing._hostpipe import HostConnection
from tests.mp import tasks
from tests.mp.compat import mpm
from tests.support.kit import BackendKit

__all__ = ["mpm"]
pytestmark = pytest.mark.timeout(120)


def test_a_pipe_on_one_host_is_a_socket_pipe_and_across_hosts_the_brokers(
        mp_backend: BackendKit) -> None:
    left, right = fmp.Pipe()
    reader, writer = fmp.Pipe(duplex=False)
    if mp_backend.same_host:
        assert all(isinstance(c, HostConnection) for c in (left, right, reader, writer))
        with socket.socket(fileno=os.dup(left.fileno())) as sock:
            assert sock.family == socket.AF_UNIX
        assert (reader.readable, reader.writable, writer.readable) == (True, False, False)
    else:  # workers dial a network address: the broker carries the pipe
        assert not any(isinstance(c, HostConnection) for c in (left, right, reader, writer))
    for conn in (left, right, reader, writer):
        conn.close()


def test_a_contexts_simple_queue_on_one_host_is_a_pipe_and_gets_with_a_timeout(
        mp_backend: BackendKit) -> None:
    """The context's `SimpleQueue` (what the stdlib's pool builds its queues from) is the
    standard library's own pipe where every process is on this host, the broker's
    elsewhere; on both, ``get`` takes ``block`` and ``timeout``, as documented."""
    q = fmp.get_context().SimpleQueue()
    assert isinstance(q, _hostpipe.HostSimpleQueue) is mp_backend.same_host
    if mp_backend.same_host:  # its ends travel as this module's, not by the stdlib's sharer
        assert isinstance(q._reader, HostConnection) and isinstance(q._writer, HostConnection)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.put(lambda: "by value")  # fiberexec's pickler, as its other queues
    assert q.get(timeout=10)() == "by value"
    q.put(2)
    assert q.get(block=False) == 2
    q.close()


def test_an_end_in_a_pools_initializer_reaches_every_worker(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    with ctx.Pool(2, initializer=tasks.keep_end, initargs=(writer,)) as pool:
        pids = pool.map(tasks.send_through_kept_end, range(8), chunksize=1)
    got = [reader.recv() for _ in range(8)]
    assert sorted(i for _, i in got) == list(range(8))
    assert {pid for pid, _ in got} == set(pids)
    writer.close()
    reader.close()


def test_an_end_passed_to_a_task_is_the_pipe_and_its_close_counts(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    with ctx.Pool(1) as pool:
        assert pool.apply(tasks.send_and_close, (writer, "hello")) == "sent"
    assert reader.recv() == "hello"
    writer.close()  # the last copy: the task's was closed there
    assert reader.poll(30)
    with pytest.raises(EOFError):
        reader.recv()


def test_an_end_sent_through_a_queue_works_in_the_process_that_gets_it(
        mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    here, there = ctx.Pipe()
    q = ctx.Queue()
    p = ctx.Process(target=tasks.fetch_end_and_echo, args=(q,))
    p.start()
    q.put(there)  # (the stdlib's feeder pickles it later: it stays open here until then)
    for i in range(100):
        here.send(i)
        assert here.recv() == i
    here.close()  # the child's recv: end-of-file
    p.join(60)
    assert p.exitcode == 0
    there.close()


def test_a_pickled_end_is_handed_over_once_then_refused_with_the_reason() -> None:
    left, right = _hostpipe.pipe(duplex=True)
    pickled = dumps_bytes(right)
    copy = loads_bytes(pickled)
    copy.send("through the copy")
    assert left.recv() == "through the copy"
    with pytest.raises(SerializationError, match="handed to another process already"):
        loads_bytes(pickled)
    for conn in (left, right, copy):
        conn.close()


def test_an_end_withdrawn_before_it_is_taken_is_closed_so_the_reader_sees_eof() -> None:
    reader, writer = _hostpipe.pipe(duplex=False)
    keys = _hostpipe.capture_keys()
    try:
        pickled = dumps_bytes(writer)  # into a process that never took it
    finally:
        _hostpipe.stop_capture()
    writer.close()
    assert not reader.poll(0.2)  # the registered copy holds the pipe open
    _hostpipe.withdraw(keys)  # its process ended
    assert reader.poll(5)
    with pytest.raises(EOFError):
        reader.recv()
    with pytest.raises(SerializationError, match="handed to another process already"):
        loads_bytes(pickled)


def test_an_end_from_a_process_that_cannot_be_reached_names_the_fix() -> None:
    _left, right = _hostpipe.pipe(duplex=True)
    rebuild, (address, key, readable, writable) = _hostpipe._reduce(right)
    gone = address.replace(b"fiberexec-mp", b"fiberexec-xx")  # no such socket here
    with pytest.raises(OSError, match="set_default_backend"):
        rebuild(gone, key, readable, writable)


def test_a_quick_first_pickling_attempt_registers_nothing() -> None:
    # fiberexec pickles plain data with the plain pickler first and may discard the result:
    # an end must not be registered (held open) by that attempt
    reader, writer = _hostpipe.pipe(duplex=False)
    data = pickle.dumps((writer, 1))
    assert _serialize.NEEDS_STDLIB in data  # so the caller switches to the full pickler
    writer.close()
    assert reader.poll(5)
    with pytest.raises(EOFError):
        reader.recv()


def test_a_peer_that_connects_and_says_nothing_holds_up_no_other_hand_over() -> None:
    _left, right = _hostpipe.pipe(duplex=True)
    pickled = dumps_bytes(right)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(_hostpipe._sharer().address)  # and never names a key
    try:
        start = time.monotonic()
        copy = loads_bytes(pickled)
        assert time.monotonic() - start < _timing.TIMING.fetch / 2
        copy.close()
    finally:
        silent.close()


def test_an_end_is_handed_over_only_on_the_hosts_own_socket() -> None:
    """This process's listener also takes TCP connections (its broker's calls): a request
    for an end that comes over TCP is refused unread, and the end stays for the process
    that asks on the Unix socket."""
    from fiberexec.multiprocessing import _broker
    from fiberexec.multiprocessing._links import HAND_OVER

    host, _, port = _broker.get_broker().address.removeprefix("tcp://").rpartition(":")
    reader, writer = _hostpipe.pipe(duplex=False)  # (on the listener that shares the ends)
    rebuild, (address, key, readable, writable) = _hostpipe._reduce(writer)
    writer.close()
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as sock:
        sock.sendall(HAND_OVER + key)
        try:
            assert sock.recv(10) == b""  # hung up on, nothing handed over
        except ConnectionResetError:
            pass
    copy = rebuild(address, key, readable, writable)
    copy.send("over the Unix socket")
    assert reader.recv() == "over the Unix socket"
    copy.close()
    reader.close()
