"""The multiprocessing layer's connections (`_links`): one handshake both ways before
anything is read, over the Unix socket and over TCP, and a peer that connects and says
nothing, or says something else, holds up no one else; and which thread reads a connection
(`Reader`): the thread that waits, else its serving thread, one at a time, on both, and on
an in-memory fake."""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fiberexec.multiprocessing import AuthenticationError, _frames, _links, _route, _timing
from tests.support.clock import FakeClock
from tests.support.sockets import memory_pair

SECRET = b"s" * 32
SERVICE = b"T"


@dataclasses.dataclass
class Listening:
    """A listener of its own (not the process's, which a broker here may share), offering
    `SERVICE` for `SECRET` on its Unix socket and on TCP on loopback (``port``)."""

    listener: _links.Listener
    admitted: queue.Queue[socket.socket]
    port: int

    @property
    def unix(self) -> str:
        return self.listener.unix


@pytest.fixture
def listening() -> Iterator[Listening]:
    admitted: queue.Queue[socket.socket] = queue.Queue()
    listener = _links.Listener(what="a test")
    listener.offer(SECRET, SERVICE, admitted.put)
    yield Listening(listener, admitted, listener.listen_tcp("127.0.0.1", "the test"))
    listener.close()
    while not admitted.empty():
        admitted.get().close()


def _hung_up(sock: socket.socket) -> bool:
    """Whether the other side closed ``sock`` (a close with our bytes unread is a reset)
    without a word."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("way", ["unix", "tcp"])
def test_a_peer_with_the_secret_gets_in_and_talks(listening: Listening, way: str) -> None:
    tcp = ("127.0.0.1", listening.port)
    unix = listening.unix if way == "unix" else "\0no-such-abstract-socket"
    with _links.dial(SECRET, unix, tcp, service=SERVICE) as sock:
        inside = listening.admitted.get(timeout=10)
        assert inside.family == (socket.AF_UNIX if way == "unix" else socket.AF_INET)
        sock.sendall(b"item")
        assert inside.recv(4) == b"item"
        inside.close()
    assert listening.listener.rejected == 0


def test_a_text_address_names_both_ways_in(listening: Listening) -> None:
    address = f"\0none|{_links.tcp_text('127.0.0.1', listening.port)}"
    assert _links.split_address(address) == ("\0none", ("127.0.0.1", listening.port))
    assert _links.split_address("\0only") == ("\0only", None)
    with _links.dial(SECRET, *_links.split_address(address), service=SERVICE):
        listening.admitted.get(timeout=10).close()
    with pytest.raises(ConnectionRefusedError, match="no TCP address"):
        _links.dial(SECRET, "\0none", service=SERVICE)


def test_a_wrong_secret_is_refused_both_ways(listening: Listening) -> None:
    with pytest.raises(AuthenticationError, match="does not hold"):
        _links.dial(b"x" * 32, listening.unix, service=SERVICE)
    with pytest.raises(queue.Empty):
        listening.admitted.get(timeout=0.5)
    assert listening.listener.rejected == 1
    # the other way round: a listener that does not hold the dialler's secret, although
    # it names the dialler's realm (as one that recorded a handshake could)
    other = _links.Listener(what="an impostor")
    other.realms[_links.realm(SECRET)] = (b"y" * 32, {SERVICE: listening.admitted.put})
    try:
        with pytest.raises(AuthenticationError, match="does not hold"):
            _links.dial(SECRET, other.unix, service=SERVICE)
    finally:
        other.close()


@pytest.mark.parametrize("opening", [
    b"R" + b"\x80\x05N." * 4,  # a request, as if authenticated
    b"\xff" * 8,  # a huge length, as if a frame
])
def test_anything_but_a_handshake_is_rejected_unread(listening: Listening,
                                                     opening: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(listening.unix)
        sock.sendall(opening + b"\0" * 40)
        assert _hung_up(sock)  # closed, nothing said
    assert listening.listener.rejected == 1
    assert listening.admitted.empty()


def test_a_silent_peer_does_not_hold_up_the_next(listening: Listening) -> None:
    with socket.create_connection(("127.0.0.1", listening.port), timeout=5):  # says nothing
        started = time.monotonic()
        with _links.dial(SECRET, "", ("127.0.0.1", listening.port), service=SERVICE):
            listening.admitted.get(timeout=10).close()
        assert time.monotonic() - started < _timing.TIMING.handshake


def test_closing_wakes_a_peer_still_in_its_handshake(listening: Listening) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(listening.unix)
        sock.sendall(_links.MAGIC)  # half a hello
        listening.listener.close()  # whether or not its handshake began, the peer hears it
        assert _hung_up(sock)
    assert listening.listener.rejected == 0  # closing is not a rejection


def test_a_service_is_admitted_only_while_offered(listening: Listening) -> None:
    """One listener serves several parts of a process (a broker's calls and streams):
    each connection names its service in the handshake, and one not offered is refused by
    name, after both sides proved the secret, so nobody learns what is offered without it."""
    listener = listening.listener
    with pytest.raises(ConnectionRefusedError, match="serves no b'Y' connections"):
        _links.dial(SECRET, listening.unix, service=b"Y")
    assert listener.rejected == 1
    other: queue.Queue[socket.socket] = queue.Queue()
    listener.offer(SECRET, b"Y", other.put)
    with _links.dial(SECRET, listening.unix, service=b"Y"):
        other.get(timeout=10).close()
    with _links.dial(SECRET, listening.unix, service=SERVICE):
        listening.admitted.get(timeout=10).close()
    assert other.empty()  # each connection went to its own service
    listener.withdraw(SECRET, b"Y")
    with pytest.raises(ConnectionRefusedError, match="serves no b'Y'"):
        _links.dial(SECRET, listening.unix, service=b"Y")
    with pytest.raises(AuthenticationError, match="does not hold"):  # the secret comes first
        _links.dial(b"x" * 32, listening.unix, service=b"Y")


def test_one_listener_serves_each_secret_apart(listening: Listening) -> None:
    """A process serves peers of several secrets (its own broker's; the brokers whose
    pipes it reads) on one socket: a connection reaches only the services of the secret it
    proves, and the same service of another secret is another service."""
    other_secret = b"o" * 32
    other: queue.Queue[socket.socket] = queue.Queue()
    listener = listening.listener
    listener.offer(other_secret, SERVICE, other.put)
    with _links.dial(other_secret, listening.unix, service=SERVICE):
        other.get(timeout=10).close()
    with _links.dial(SECRET, "", ("127.0.0.1", listening.port), service=SERVICE):
        listening.admitted.get(timeout=10).close()
    assert other.empty() and listening.admitted.empty()
    listener.withdraw(other_secret, SERVICE)
    with pytest.raises(ConnectionRefusedError, match="no longer serves"):
        _links.dial(other_secret, listening.unix, service=SERVICE)
    with _links.dial(SECRET, listening.unix, service=SERVICE):  # the first is still served
        listening.admitted.get(timeout=10).close()


def test_a_secret_served_no_more_is_refused_not_a_wrong_proof(
        listening: Listening, log_event: Callable[[str, int], threading.Event]) -> None:
    """The process's listener outlives each server on it: a peer dialling a server that has
    closed hears what a closed listener would say (refused: the server is gone), not that
    its secret is wrong; a secret never served here still fails its proof, and one offered
    again is served again."""
    listener, other_secret = listening.listener, b"o" * 32
    listener.offer(other_secret, b"Y", listening.admitted.put)
    listener.withdraw(other_secret, b"Y")
    with pytest.raises(ConnectionRefusedError, match="no longer serves"):
        _links.dial(other_secret, listening.unix, service=b"Y")
    assert listener.rejected == 0  # as a connection to a closed listener is none
    rejected = log_event("rejected a connection", 1)  # counted as the dialler hangs up
    with pytest.raises(AuthenticationError, match="does not hold"):
        _links.dial(b"n" * 32, listening.unix, service=b"Y")
    assert rejected.wait(10)
    assert listener.rejected == 1
    listener.offer(other_secret, b"Y", listening.admitted.put)
    with _links.dial(other_secret, listening.unix, service=b"Y"):
        listening.admitted.get(timeout=10).close()


def test_a_tcp_port_lasts_while_a_service_uses_it(listening: Listening) -> None:
    """Services that listen on TCP on the same host share its port; the port closes when
    the last of them is withdrawn, and the Unix socket stays for the others."""
    listener = listening.listener
    listener.offer(SECRET, b"Y", listening.admitted.put)
    listener.offer(SECRET, b"Z", listening.admitted.put)
    y_port = listener.listen_tcp("127.0.0.2", (_links.realm(SECRET), b"Y"))
    assert listener.listen_tcp("127.0.0.2", (_links.realm(SECRET), b"Z")) == y_port
    listener.withdraw(SECRET, b"Y")
    with _links.dial(SECRET, "", ("127.0.0.2", y_port), service=b"Z"):
        listening.admitted.get(timeout=10).close()
    listener.withdraw(SECRET, b"Z")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", y_port), timeout=5).close()
    with _links.dial(SECRET, listening.unix, service=SERVICE):
        listening.admitted.get(timeout=10).close()


def test_a_process_listens_in_one_place() -> None:
    """`shared`: every offer of this process is on one listener, which closes with the last
    offer withdrawn; the next offer opens a new one."""
    admitted: queue.Queue[socket.socket] = queue.Queue()
    first = _links.shared(b"1" * 32, SERVICE, admitted.put)
    second = _links.shared(b"2" * 32, b"Y", admitted.put)
    try:
        assert first.listener is second.listener and first.unix == second.unix
        with _links.dial(b"2" * 32, first.unix, service=b"Y"):
            admitted.get(timeout=10).close()
    finally:
        first.withdraw()
        others = bool(second.listener.realms.keys() - {_links.realm(b"2" * 32)})
        second.withdraw()
    # closed, unless something else in this test process (a broker) offers there too
    assert second.listener.closed is not others
    third = _links.shared(b"3" * 32, SERVICE, admitted.put)
    try:
        assert (third.listener is first.listener) is others
    finally:
        third.withdraw()


def test_the_outward_address_of_a_loopback_peer_is_none() -> None:
    assert _links.outward_ip("tcp://127.0.0.1:9") is None
    assert _links.outward_ip("not an address") is None


# --------------------------------------------------------------- which thread reads: Reader


@pytest.fixture(params=["unix", "tcp", "memory"])
def wires(request: pytest.FixtureRequest) -> Iterator[tuple[_links.Wire, _links.Wire]]:
    """Two ends of one connection, as the layer's sockets are: Unix, or TCP on loopback;
    and the in-memory fake of ``tests/support/sockets.py``, which must pass the same."""
    left: Any
    right: Any
    if request.param == "unix":
        left, right = socket.socketpair()
    elif request.param == "memory":
        left, right = memory_pair()
    else:
        with socket.create_server(("127.0.0.1", 0)) as server:
            left = socket.create_connection(server.getsockname())
            right = server.accept()[0]
    yield _links.Wire(left), _links.Wire(right)
    left.close()
    right.close()


class Seen:
    """What a `Reader` applied, by which thread, and how often it reported its end."""

    def __init__(self) -> None:
        self.frames: queue.Queue[tuple[bytes, int]] = queue.Queue()
        self.ends: queue.Queue[int] = queue.Queue()

    def apply(self, frame: bytes) -> None:
        self.frames.put((frame, threading.get_ident()))

    def lost(self) -> None:
        self.ends.put(threading.get_ident())


Wires = tuple[_links.Wire, _links.Wire]


def test_frames_arrive_whole_and_in_order_whatever_their_size(wires: Wires) -> None:
    """Small frames sent one after another arrive as one read's worth; one larger than a
    read arrives whole; a frame of parts is one frame; a tagged frame keeps its head."""
    mine, theirs = wires
    sizes = [0, 1, 100, 70_000, 5, 3 << 20, 2]
    sent = [os.urandom(size) for size in sizes]
    writer = threading.Thread(target=lambda: [theirs.send_parts([b]) for b in sent])
    writer.start()  # (a large frame fills the socket's buffer before it is read)
    assert [mine.recv_bytes() for _ in sizes] == sent
    writer.join(30)
    theirs.send_parts([b"ab", memoryview(b"cd"), b""])
    theirs.send(_frames.Put(7, b"body"))
    assert mine.recv_bytes() == b"abcd"
    tagged = mine.recv_bytes()
    assert tagged[:1] == _frames.Put.TAG and tagged[-4:] == b"body" and len(tagged) == 1 + 8 + 4


def test_a_frame_over_the_limit_is_refused_before_any_byte_is_sent(
        wires: Wires, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names the rule, the size and what to do; the connection stays usable."""
    mine, theirs = wires
    monkeypatch.setattr(_links, "MAX_FRAME", 100)
    with pytest.raises(ValueError, match=r"a message of 109 bytes is over the 100-byte limit "
                                         r"of one frame; send large data in pieces"):
        theirs.send(_frames.Put(7, b"x" * 100))
    with pytest.raises(ValueError, match="a message of 101 bytes is over the 100-byte limit"):
        theirs.send_parts([b"x" * 50, b"y" * 51])
    theirs.send_parts([b"z" * 100])
    assert mine.recv_bytes() == b"z" * 100


def test_poll_says_whether_a_frame_began_and_the_end_is_eof(wires: Wires) -> None:
    mine, theirs = wires
    assert not mine.poll(0)
    assert not mine.poll(0.01)
    theirs.send_parts([b"one"])
    theirs.send_parts([b"two"])
    assert mine.poll(10)
    assert mine.recv_bytes() == b"one"
    assert mine.poll(10) and mine.recv_bytes() == b"two"
    assert not mine.poll(0)
    wake = _links.thread_wake()
    wake.set(True)
    assert not mine.poll(10, wake.r)  # a wake ends the wait, and is not the socket
    wake.set(False)
    theirs.shutdown()
    assert mine.poll(10)  # the end is readable
    with pytest.raises(EOFError):
        mine.recv_bytes()


def test_a_send_to_an_end_that_is_gone_fails(wires: Wires) -> None:
    mine, theirs = wires
    mine.shutdown()

    def send_until_it_fails() -> None:
        for _ in range(100):  # (TCP may take a first send before it knows)
            theirs.send_parts([b"x" * 1000])

    with pytest.raises(OSError):
        send_until_it_fails()


def test_a_waiting_thread_reads_the_socket_itself(wires: Wires) -> None:
    mine, theirs = wires
    seen = Seen()
    reader = _links.Reader(mine, seen.apply, seen.lost)
    cond = threading.Condition()
    theirs.send_parts([b"one"])
    with cond:
        assert reader.try_lead(cond, None, 10)
    assert seen.frames.get_nowait() == (b"one", threading.get_ident())
    assert not reader.role.locked()


def test_only_one_thread_reads_at_a_time(wires: Wires) -> None:
    mine, theirs = wires
    seen = Seen()
    reader = _links.Reader(mine, seen.apply, seen.lost)
    theirs.send_parts([b"for the leader"])
    outcome: queue.Queue[bool] = queue.Queue()

    def lead() -> None:
        cond = threading.Condition()
        with cond:
            outcome.put(reader.try_lead(cond, None, 30))

    with reader.role:  # another thread reads the socket now
        other = threading.Thread(target=lead)
        other.start()
        assert outcome.get(timeout=10) is False
        other.join(10)
    assert seen.frames.empty()
    other = threading.Thread(target=lead)
    other.start()
    assert outcome.get(timeout=10) is True
    other.join(10)
    assert seen.frames.get_nowait() == (b"for the leader", other.ident)


def test_a_wake_ends_a_lead_with_nothing_read(wires: Wires) -> None:
    mine, _ = wires
    seen = Seen()
    reader = _links.Reader(mine, seen.apply, seen.lost)
    wake = _links.thread_wake()
    threading.Timer(0.05, wake.wake).start()
    started = time.monotonic()
    cond = threading.Condition()
    with cond:
        assert reader.try_lead(cond, wake, 30)
    assert time.monotonic() - started < 30
    assert seen.frames.empty() and seen.ends.empty()


def test_the_serving_thread_reads_what_nobody_waits_for(wires: Wires) -> None:
    mine, theirs = wires
    seen = Seen()
    reader = _links.Reader(mine, seen.apply, seen.lost)
    reader.start("test-serving")
    reader.start("test-serving-again")  # once only
    theirs.send_parts([b"unasked"])
    frame, thread = seen.frames.get(timeout=10)
    assert frame == b"unasked" and thread != threading.get_ident()
    served = [t for t in threading.enumerate() if t.name.startswith("test-serving")]
    assert [t.name for t in served] == ["test-serving"]
    theirs.shutdown()
    assert seen.ends.get(timeout=10) == thread
    served[0].join(10)
    assert seen.ends.empty() and reader.ended


def test_a_held_socket_is_read_by_the_thread_that_asked(wires: Wires) -> None:
    """`hold` takes the socket from the serving thread before an answer can come, so the
    answer reaches the asking thread directly (the clock stands still: the hold never runs
    out); it gives it back when nobody leads."""
    mine, theirs = wires
    seen = Seen()
    clock = FakeClock(0.0)
    reader = _links.Reader(mine, seen.apply, seen.lost, clock=clock)
    reader.start("test-serving")
    cond = threading.Condition()
    for n in range(3):
        reader.hold()
        theirs.send_parts([b"answer %d" % n])
        with cond:
            assert reader.try_lead(cond, None, 10)
        assert seen.frames.get_nowait() == (b"answer %d" % n, threading.get_ident())
    reader.unhold()
    clock.now = 1.0  # (the serving thread stops checking holds)
    theirs.send_parts([b"unasked"])
    frame, thread = seen.frames.get(timeout=10)
    assert frame == b"unasked" and thread != threading.get_ident()
    theirs.shutdown()
    seen.ends.get(timeout=10)


def test_a_hold_nobody_reads_under_goes_back_once_its_time_is_up(wires: Wires) -> None:
    """A hold keeps what comes from the serving thread for `Timing.hold` of the reader's
    clock, then the serving thread reads it."""
    mine, theirs = wires
    seen = Seen()
    clock = FakeClock(0.0)
    reader = _links.Reader(mine, seen.apply, seen.lost, clock=clock)
    reader.start("test-serving")
    reader.hold()
    theirs.send_parts([b"for the asker"])
    with pytest.raises(queue.Empty):  # the clock stands still: still held
        seen.frames.get(timeout=0.2)
    clock.now += 2 * _timing.TIMING.hold
    frame, thread = seen.frames.get(timeout=10)
    assert frame == b"for the asker" and thread != threading.get_ident()
    theirs.shutdown()
    seen.ends.get(timeout=10)


def test_the_end_is_reported_once_by_whoever_reads_it(wires: Wires) -> None:
    mine, theirs = wires
    seen = Seen()
    reader = _links.Reader(mine, seen.apply, seen.lost)
    theirs.shutdown()
    cond = threading.Condition()
    with cond:
        assert reader.try_lead(cond, None, 10)  # no serving thread: the leader reports it
        assert not reader.leadable
        assert not reader.try_lead(cond, None, 10)
    assert seen.ends.get_nowait() == threading.get_ident()
    reader.start("test-serving")  # too late: nothing more to read or report
    assert not any(t.name == "test-serving" for t in threading.enumerate())
    assert seen.ends.empty() and seen.frames.empty()


def test_a_frame_the_reader_cannot_apply_ends_the_connection(wires: Wires) -> None:
    mine, theirs = wires
    seen = Seen()

    def refuse(frame: bytes) -> None:
        raise ValueError(f"unknown frame {frame!r}")

    reader = _links.Reader(mine, refuse, seen.lost)
    theirs.send_parts([b"?"])
    cond = threading.Condition()
    with cond:
        reader.try_lead(cond, None, 10)
    assert seen.ends.get_nowait() == threading.get_ident()
    with pytest.raises(EOFError):
        theirs.recv_bytes()


@pytest.mark.parametrize("way", ["unix", "tcp"])
def test_a_process_leaving_waits_until_its_peers_have_read_what_it_sent(way: str) -> None:
    """Before a process exits (`_route.finish`, and `Stream.finish` alike): over TCP it
    ends what it sends and waits until its peer, having read it all, closes (closed with
    bytes of its peer's unread, or sent to once closed, a TCP socket is reset, and what
    it had not yet sent is dropped); over a Unix socket there is nothing to wait for."""
    if way == "unix":
        left, right = socket.socketpair()
    else:
        with socket.create_server(("127.0.0.1", 0)) as server:
            left = socket.create_connection(server.getsockname())
            right = server.accept()[0]
    link = _route.Link(_links.Wire(left))
    cond = threading.Condition()

    def lost() -> None:
        with cond:
            link.closed = True
            cond.notify_all()

    # the writer's side reads its peer's answers with a thread of its own, as `Outlets`
    link.reader = _links.Reader(link.wire, lambda frame: None, lost)
    link.reader.start("test-writer-answers")
    sent = [os.urandom(2000) for _ in range(32)]  # (less than a socket buffer holds)
    for frame in sent:
        with link.lock:
            link.wire.send_parts([frame])
    if way == "unix":
        assert _route.finish([link], cond, 0.0)
        right.close()
        left.close()
        return
    assert not _route.finish([link], cond, 0.2)  # its peer has read nothing yet
    seen = Seen()
    peer = _links.Reader(_links.Wire(right), seen.apply, seen.lost)
    peer.start("test-reader")  # reads to the end (the half close), then closes
    assert _route.finish([link], cond, 10)
    assert [seen.frames.get(timeout=10)[0] for _ in sent] == sent
    assert seen.ends.get(timeout=10)
    assert link.closed


def test_a_process_with_a_broker_an_inlet_and_shared_ends_listens_once() -> None:
    """This process serves its own broker's calls and streams, hands over pipe ends, and
    reads a queue of a child's broker (another secret: writers elsewhere may connect to
    its inlet): all on one listener, its one abstract Unix socket."""
    import psutil

    import fiberexec.multiprocessing as fmp
    from fiberexec._serialize import dumps_bytes
    from fiberexec.multiprocessing import _broker, _hostpipe, _stream
    from tests.mp import route_tasks

    q, stop = fmp.Queue(), fmp.Event()
    child = fmp.Process(target=route_tasks.queue_of_its_own, args=(q, stop))
    child.start()
    try:
        theirs = q.get(timeout=60)
        assert theirs.get(timeout=60) == "from the child"
        stream = _stream.stream_for(theirs._ep())
        assert stream is not None and stream.inlet is not None  # ready for direct writers
        _reader, writer = fmp.Pipe()
        dumps_bytes(writer)  # shared: registered for the process that unpickles it
        name = _links.split_address(stream.inlet.address)[0]  # (and TCP, across hosts)
        assert name == _broker.get_broker().server.local_name
        assert name == _hostpipe._sharer().address.decode()
        assert _broker.get_broker().server.offer.listener is stream.inlet.offer.listener
        listening = {c.laddr for c in psutil.Process().net_connections(kind="unix")}
        assert "@" + name.lstrip("\0") in listening
    finally:
        stop.set()
        child.join(60)
