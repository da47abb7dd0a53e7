"""The link seam's contract (`fiberexec._link`), checked on every link implementation.

Each case makes an executor end and a worker end joined by one link: the local link (an
abstract Unix socket), the network links (a TCP stream on loopback, and pynng Pair1, the
one TLS rides on), and the in-memory fake of ``tests/support/links.py``. The same checks
run on all four, so the shard and the worker can rely on the contract whichever link a
worker uses.
"""

from __future__ import annotations

import gc
import itertools
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiberexec._errors import ConfigurationError, LinkClosed, ProtocolError
from fiberexec._framing import FrameBuffer, framed
from fiberexec._link import Endpoint, connect, dial
from fiberexec._link_nng import Channel, NngLink
from fiberexec._link_stream import TcpListener, tcp_host_port
from tests.support.links import MemoryEndpoint

MAX = 64 << 20
PIECE = 100_000  # bytes a socket pair surely holds with no one reading


@dataclass
class Pair:
    endpoint: Any
    worker: Any
    removed: list[Any] = field(default_factory=list)
    gone: threading.Event = field(default_factory=threading.Event)  # the executor's end heard
    worker_gone: threading.Event = field(default_factory=threading.Event)  # the worker's did

    def recv_all(self, n: int, timeout: float = 10.0) -> list[Any]:
        """``n`` frames at the executor's end, waiting on its ``fileno()`` as a shard does."""
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(got)} of {n} frames arrived"
            select.select([self.endpoint.fileno()], [], [], left)
            while (msg := self.endpoint.try_recv()) is not None:
                got.append(msg)
        return got


    def worker_recv_all(self, n: int, timeout: float = 10.0) -> list[bytes]:
        """``n`` frames at the worker's end, serving the executor's end meanwhile (a shard
        serves its fd, which is how frames that waited for room go out)."""
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < n:
            assert time.monotonic() < deadline, f"only {len(got)} of {n} frames arrived"
            if select.select([self.endpoint.fileno()], [], [], 0)[0]:
                assert self.endpoint.try_recv() is None
            frame = self.worker.recv(0.02)
            if frame is not None:
                got.append(frame)
        return got


def _on_remove(pair: list[Pair]) -> Callable[[Any], None]:
    def removed(pipe: Any) -> None:
        pair[0].removed.append(pipe)
        pair[0].gone.set()

    return removed


def _real(kind: str) -> Pair:
    """The executor's end with a local listener and a network one (nng's channel for "nng",
    else a TCP port), and a worker joined to it by the ``kind`` of link."""
    holder: list[Pair] = []
    network: Channel | TcpListener
    if kind == "nng":
        network = Channel.listen("127.0.0.1", max_message=MAX, on_connect=lambda pipe: None,
                                 on_remove=_on_remove(holder))
    else:
        network = TcpListener("127.0.0.1")
    name = f"fiberexec-test/{os.getpid()}/{secrets.token_hex(4)}"
    endpoint = Endpoint(name, network, on_remove=_on_remove(holder), max_frame=MAX)
    worker_gone = threading.Event()
    worker: Any
    if kind == "unix":
        worker = connect(name, endpoint.address, max_frame=MAX,
                         on_remove=lambda pipe: worker_gone.set())
    elif kind == "nng":  # (a plain tcp:// address is dialed as a stream: see `dial`)
        worker = NngLink(Channel.dial(endpoint.address, max_message=MAX,
                                      on_remove=lambda pipe: worker_gone.set()))
    else:
        worker = dial(endpoint.address, max_frame=MAX, on_remove=lambda pipe: worker_gone.set())
    assert worker.kind == kind
    pair = Pair(endpoint, worker, worker_gone=worker_gone)
    holder.append(pair)
    return pair


def _memory() -> Pair:
    holder: list[Pair] = []
    endpoint = MemoryEndpoint(_on_remove(holder))
    pair = Pair(endpoint, endpoint.connect())
    holder.append(pair)
    return pair


@pytest.fixture(params=["unix", "tcp", "nng", "memory"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    made = _memory() if request.param == "memory" else _real(request.param)
    try:
        yield made
    finally:
        made.worker.close()
        made.endpoint.close()


def _hello(pair: Pair) -> Any:
    """The worker speaks first (as its Hello does); the executor binds to that peer."""
    pair.worker.send(b"hello", 10)
    (msg,) = pair.recv_all(1)
    assert msg.bytes == b"hello"
    pair.endpoint.bind(msg.pipe)
    return msg.pipe


def test_frames_from_the_worker_arrive_whole_in_order_from_one_peer(pair: Pair) -> None:
    frames = [secrets.token_bytes(n) for n in (0, 1, 3, 4, 5, 1000, 70_000, 300_000)] * 3
    sender = threading.Thread(target=lambda: [pair.worker.send(f, 10) for f in frames])
    sender.start()  # more than a socket buffer holds: the executor reads meanwhile
    got = pair.recv_all(len(frames))
    sender.join(10)
    assert [m.bytes for m in got] == frames
    assert len({m.pipe.id for m in got}) == 1


def test_frames_to_the_worker_arrive_whole_in_order(pair: Pair) -> None:
    _hello(pair)
    frames = [secrets.token_bytes(n) for n in (1, 7, 4096, 200_000)] * 5
    for frame in frames:
        pair.endpoint.send_nowait(frame)
    assert pair.worker_recv_all(len(frames)) == frames


def test_fileno_is_readable_exactly_while_a_frame_waits(pair: Pair) -> None:
    fd = pair.endpoint.fileno()
    assert pair.endpoint.try_recv() is None  # takes in the connecting peer, if any
    assert select.select([fd], [], [], 0)[0] == []
    pair.worker.send(b"x", 10)
    assert select.select([fd], [], [], 10)[0] == [fd]
    assert pair.endpoint.try_recv().bytes == b"x"
    assert pair.endpoint.try_recv() is None
    assert select.select([fd], [], [], 0.05)[0] == []


def test_the_workers_fileno_is_readable_while_a_frame_waits(pair: Pair) -> None:
    """What the worker's watcher thread polls while its main thread runs a task."""
    _hello(pair)
    fd = pair.worker.fileno()
    assert select.select([fd], [], [], 0)[0] == []
    pair.endpoint.send_nowait(b"y")
    assert select.select([fd], [], [], 10)[0] == [fd]
    assert pair.worker.recv(10) == b"y"
    assert pair.worker.try_recv() is None
    assert select.select([fd], [], [], 0.05)[0] == []
    if pair.worker.kind != "nng":  # (nng says so through the pipe's remove callback)
        pair.endpoint.close()  # the hang-up polls readable too
        assert select.select([fd], [], [], 10)[0] == [fd]


def test_large_frames_both_ways(pair: Pair) -> None:
    big = secrets.token_bytes(8 << 20)
    _hello(pair)
    pair.endpoint.send_nowait(big)
    received: list[bytes | None] = []
    reader = threading.Thread(target=lambda: received.append(pair.worker.recv(30)))
    reader.start()
    sender = threading.Thread(target=pair.worker.send, args=(big, 30))
    sender.start()
    (msg,) = pair.recv_all(1, timeout=30)  # serving the fd also flushes what waits to go
    sender.join(30)
    assert msg.bytes == big
    deadline = time.monotonic() + 30
    while reader.is_alive() and time.monotonic() < deadline:
        select.select([pair.endpoint.fileno()], [], [], 0.05)
        assert pair.endpoint.try_recv() is None
    reader.join(1)
    assert received == [big]


def test_executor_sends_never_block_on_a_worker_that_does_not_read(pair: Pair) -> None:
    """Far more than socket buffers hold: each send returns at once, queued or refused."""
    _hello(pair)
    frame = secrets.token_bytes(64 << 10)
    sent = 0
    started = time.monotonic()
    try:
        for _ in range(400):
            pair.endpoint.send_nowait(frame)
            sent += 1
    except ProtocolError:
        pass
    assert time.monotonic() - started < 5
    assert sent >= 100  # a slow reader is not treated as a dead one
    assert pair.worker_recv_all(sent, timeout=60) == [frame] * sent  # all of it, in order


def test_recv_times_out_with_none(pair: Pair) -> None:
    started = time.monotonic()
    assert pair.worker.recv(0.2) is None
    assert 0.15 <= time.monotonic() - started < 5
    assert pair.worker.try_recv() is None


def test_a_worker_that_hangs_up_is_reported_once(pair: Pair) -> None:
    pipe = _hello(pair)
    pair.worker.close()
    deadline = time.monotonic() + 10
    while not pair.gone.is_set() and time.monotonic() < deadline:
        select.select([pair.endpoint.fileno()], [], [], 0.1)
        pair.endpoint.try_recv()
    for _ in range(5):  # serving the endpoint more reports nothing more
        select.select([pair.endpoint.fileno()], [], [], 0.02)
        assert pair.endpoint.try_recv() is None
    assert [p.id for p in pair.removed] == [pipe.id]


def test_the_worker_learns_when_the_executor_hangs_up(pair: Pair) -> None:
    _hello(pair)
    pair.endpoint.close()
    gone = pair.worker_gone
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not gone.is_set():
        try:
            pair.worker.recv(0.1)
        except LinkClosed:
            return
    assert gone.is_set(), "the worker never learned that the executor hung up"


def test_sealing_keeps_the_bound_peer_and_refuses_new_ones(pair: Pair) -> None:
    pipe = _hello(pair)
    pair.endpoint.seal()
    pair.endpoint.send_nowait(b"after seal")
    assert pair.worker.recv(10) == b"after seal"
    pair.worker.send(b"reply", 10)
    (msg,) = pair.recv_all(1)
    assert msg.bytes == b"reply" and msg.pipe.id == pipe.id
    if isinstance(pair.endpoint, Endpoint) and pair.worker.kind != "nng":
        with socket.socket(socket.AF_UNIX) as other, pytest.raises(ConnectionRefusedError):
            other.connect("\0" + pair.endpoint.local_name)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(tcp_host_port(pair.endpoint.address), 10).close()


# ---------------------------------------------------------------------------- the local link


def test_a_worker_elsewhere_falls_back_to_the_network_link() -> None:
    """Without TLS the executor's network way in is a TCP port the worker streams to (with
    TLS it is nng's channel, dialed at a ``tls+tcp://`` address: ``behaviour/test_tls.py``)."""
    network = TcpListener("127.0.0.1")
    try:
        link = connect(f"fiberexec-test/nobody-listens/{secrets.token_hex(4)}",
                       network.address, max_frame=MAX, on_remove=lambda pipe: None)
        try:
            assert link.kind == "tcp"
        finally:
            link.close()
    finally:
        network.close()


def test_a_tcp_dial_goes_on_while_refused_then_says_why() -> None:
    """A worker whose executor's port refuses dials again (the port may open late; a
    worker whose executor is gone stays until its connect timeout, as a stray) and then
    says so."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listened on: connections are refused
        address = f"tcp://127.0.0.1:{closed.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(LinkClosed, match="refused the connection for 0.3 s"):
            dial(address, max_frame=MAX, on_remove=lambda pipe: None, timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5


def test_a_tcp_dial_reaches_a_port_that_opens_late() -> None:
    with socket.create_server(("127.0.0.1", 0)) as late:
        port = late.getsockname()[1]
        late.close()
        opened = threading.Timer(0.2, lambda: listening.append(socket.create_server(
            ("127.0.0.1", port))))
        listening: list[socket.socket] = []
        opened.start()
        try:
            link = dial(f"tcp://127.0.0.1:{port}", max_frame=MAX, on_remove=lambda p: None,
                        timeout=10)
            assert link.kind == "tcp"
            link.close()
        finally:
            opened.join(10)
            for sock in listening:
                sock.close()


@pytest.mark.parametrize("address", ["tcp://", "tcp://host", "tcp://:80", "tcp://h:port",
                                     "udp://127.0.0.1:80"])
def test_a_tcp_address_that_is_not_one_is_named(address: str) -> None:
    with pytest.raises(LinkClosed, match="must be tcp://host:port"):
        tcp_host_port(address)


def _two_free_ports() -> int:
    """A port whose next one is free too (a port the kernel hands out may have a neighbour
    in use: another test's connection)."""
    for _ in range(50):
        first = TcpListener("127.0.0.1")
        try:
            TcpListener("127.0.0.1", ports=(first.port + 1, first.port + 1)).close()
        except ConfigurationError:
            continue
        finally:
            first.close()
        return first.port
    raise AssertionError("no two free ports side by side on loopback in 50 tries")


def test_tcp_ports_come_from_the_configured_range_and_run_out_clearly() -> None:
    low = _two_free_ports()
    listeners = [TcpListener("127.0.0.1", ports=(low, low + 1), first=low)]
    try:
        listeners.append(TcpListener("127.0.0.1", ports=(low, low + 1), first=low))
        assert sorted(each.port for each in listeners) == [low, low + 1]
        assert listeners[0].address == f"tcp://127.0.0.1:{listeners[0].port}"
        with pytest.raises(ConfigurationError, match=f"every port of ports={low}-{low + 1}"):
            TcpListener("127.0.0.1", ports=(low, low + 1))
    finally:
        for listener in listeners:
            listener.close()


def test_a_tcp_listener_speaks_ipv6_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("this machine has no IPv6")
    try:
        listener = TcpListener("::1")
    except OSError as exc:  # the kernel may have IPv6 off
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        assert listener.address == f"tcp://[::1]:{listener.port}"
        assert tcp_host_port(listener.address) == ("::1", listener.port)
        link = dial(listener.address, max_frame=MAX, on_remove=lambda pipe: None, timeout=10)
        link.close()
    finally:
        listener.close()


def test_a_worker_nobody_listens_for_says_why() -> None:
    """Nobody listens under its name and it has no network address: the executor is gone,
    or stopped waiting for this worker's start, or the worker is on another host."""
    with pytest.raises(LinkClosed, match="gave up waiting for this worker's start") as caught:
        connect(f"fiberexec-test/nobody-listens/{secrets.token_hex(4)}", "", max_frame=MAX,
                on_remove=lambda pipe: None)
    assert "has shut down or exited" in str(caught.value)
    assert "network namespace" in str(caught.value)


def test_a_local_peer_of_another_user_is_refused() -> None:
    """SO_PEERCRED: a process of another user cannot even start the handshake."""
    if os.getuid() != 0:
        pytest.skip("needs root to run a process as another user")  # CI runs as root
    pair = _real("unix")
    try:
        pid = os.fork()
        if pid == 0:  # the other user: connects, then reports what it heard back
            code = 1
            try:
                _forked_child()
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect("\0" + pair.endpoint.local_name)
                    sock.settimeout(10)
                    code = 0 if sock.recv(10) == b"" else 2  # hung up on at once
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            select.select([pair.endpoint.fileno()], [], [], 0.1)
            assert pair.endpoint.try_recv() is None
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, "the connection was not cut"
                break
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the other user's connection was not closed")
        assert pair.endpoint.listener is not None and pair.endpoint.listener.refused == 1
        assert len(pair.endpoint.pipes) == 1  # the pair's own worker only
    finally:
        pair.worker.close()
        pair.endpoint.close()


def _forked_child() -> None:
    """In a child forked from the test process: collect no garbage. Earlier tests leave
    pynng sockets for the collector, and closing one in a child, where nng's threads were
    not forked, aborts the child (seen once in a full run)."""
    gc.disable()


def _voluntary_switches() -> int:
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        return next(int(line.split()[1]) for line in status
                    if line.startswith("voluntary_ctxt_switches:"))


def test_a_worker_waiting_for_a_frame_sleeps_once_per_frame() -> None:
    """A worker sends a result, then waits for its next task: the executor's reading of
    that result frees the worker's send buffer, and must not wake the waiting worker. (A
    wait inside ``recv`` did wake: the kernel signals room to write on the same wait queue,
    so every round trip cost the worker a second, empty wake-up.) A forked child plays the
    worker, single-threaded, and counts the times it went to sleep."""
    rounds = 200
    pair = _real("unix")
    pair.worker.close()  # the child is the worker
    report_r, report_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the worker: a round trip at a time, then its count of sleeps
            code = 1
            try:
                _forked_child()
                link = connect(pair.endpoint.local_name, "", max_frame=MAX,
                               on_remove=lambda pipe: None)
                link.send(b"hello", 10)
                link.recv(10)
                before = _voluntary_switches()
                for i in range(rounds):
                    link.send(b"result %d" % i, 10)
                    assert link.recv(10) == b"task %d" % (i + 1)
                os.write(report_w, b"%d" % (_voluntary_switches() - before))
                code = 0
            finally:
                os._exit(code)
        os.close(report_w)
        (hello,) = pair.recv_all(1)
        assert hello.bytes == b"hello"
        pair.endpoint.bind(hello.pipe)
        pair.endpoint.send_nowait(b"task 0")
        for i in range(rounds):
            (msg,) = pair.recv_all(1)
            assert msg.bytes == b"result %d" % i
            time.sleep(0.0005)  # the worker is asleep by now, before the task goes out
            pair.endpoint.send_nowait(b"task %d" % (i + 1))
        with os.fdopen(report_r, "rb") as report:
            slept = int(report.read() or b"-1")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert 0 <= slept < rounds * 1.25, f"the worker slept {slept} times in {rounds} waits"
    finally:
        pair.worker.close()
        pair.endpoint.close()


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 3, 4, 5, 100, 65_531, 65_536, 70_000,
                                       300_000, 700_000]), min_size=1, max_size=8),
       cuts=st.lists(st.floats(min_value=0, max_value=1), max_size=12))
def test_the_local_links_reader_cuts_any_stream_into_its_frames(
        sizes: list[int], cuts: list[float]) -> None:
    """However the stream arrives (a header split, many frames in one read, a frame longer
    than the read buffer and than what it keeps), each frame comes out whole, in order."""
    frames = [secrets.token_bytes(size) for size in sizes]
    stream = b"".join(b"".join(framed(frame)) for frame in frames)
    points = sorted({0, len(stream), *(round(c * len(stream)) for c in cuts)})
    # pieces cut there, and no longer than a socket's buffer takes without a reader
    pieces = [stream[at : min(end, at + PIECE)] for start, end in itertools.pairwise(points)
              for at in range(start, end, PIECE)]
    reader = FrameBuffer(1 << 20)
    got: list[bytes] = []
    a, b = socket.socketpair()
    with a, b:
        for piece in pieces:
            a.sendall(piece)
            b.setblocking(False)
            while True:  # what was sent is all there: read until it is taken
                try:
                    cut = reader.read(b)
                except BlockingIOError:
                    break
                assert cut is not None
                got.extend(cut)
    assert got == frames


def test_the_local_links_reader_refuses_a_frame_over_the_limit() -> None:
    reader = FrameBuffer(1000)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"".join(framed(b"x" * 1001)))
        with pytest.raises(ProtocolError, match="1001-byte frame exceeds max_message_size=1000"):
            reader.read(b)
        a.close()
        assert FrameBuffer(1000).read(b) is None  # the stream ended


def test_the_local_links_reader_holds_a_buffer_only_once_a_frame_comes_in_pieces() -> None:
    """An executor with a thousand workers keeps no read buffer for a worker whose
    messages each arrive whole, one or several at once (a result, and a report sent right
    after it); the first one that comes in pieces makes it."""
    reader = FrameBuffer(1 << 20)
    a, b = socket.socketpair()
    with a, b:
        for frame in (b"one", b"two" * 100):
            a.sendall(b"".join(framed(frame)))
            assert reader.read(b) == [frame]
        a.sendall(b"".join(part for frame in (b"four", b"five" * 9) for part in framed(frame)))
        assert reader.read(b) == [b"four", b"five" * 9]
        assert reader.held_bytes() == 0
        two_and_a_half = b"".join(part for frame in (b"six", b"seven", b"eight" * 5)
                                  for part in framed(frame))
        a.sendall(two_and_a_half[:-4])
        assert reader.read(b) == [b"six", b"seven"]
        a.sendall(two_and_a_half[-4:])
        assert reader.read(b) == [b"eight" * 5]
        whole = b"".join(framed(b"three" * 10))
        a.sendall(whole[:7])
        assert reader.read(b) == []
        a.sendall(whole[7:])
        assert reader.read(b) == [b"three" * 10]
        assert reader.held_bytes() > 0  # kept for the next frame in pieces
