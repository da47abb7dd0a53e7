"""Every connection of the multiprocessing layer: one handshake, one listener, one dial,
one framing (`Wire`).

Calls to a broker or a manager (`RPC`, `_rpc`), a process's stream to a broker (`STREAM`,
`_stream`, `_hub`) and direct routes between two processes (`PIPE`, `_route`) all connect
here, each connection naming the secret it proves and the service it wants. A process
listens in one place (`shared`): its broker's calls and streams, a manager's calls, the
writers of the pipes it reads (with the secrets of those pipes' brokers) and the processes
that take pipe ends it shares (`_hostpipe`) all come in through one abstract socket::

    shared(secret, service, admit)              dial(secret, unix, tcp, service=...)
      an abstract Unix socket (Linux), and          the Unix socket when this process
      TCP on each host a service asks for           reaches it (same host and network
      each connection: a thread of its own  <----   namespace), else TCP within a timeout
      proves the secret within Timing.handshake,
      then its service's ``admit(sock)`` runs in that thread

The handshake is the executor's (`fiberexec._auth`), on the raw socket before any frame::

    client -> server   MAGIC, realm, nonce_c, service (one byte)
    server -> client   nonce_s, HMAC(secret, "mp-server", realm + nonce_c + service, nonce_s)
    client -> server   HMAC(secret, "mp-client", realm + nonce_c + service, nonce_s)
    server -> client   b"K" (admitted), b"N" (no such service here), or b"D"; but for
                       b"K", the connection closes

The realm names which of the secrets a process serves the client holds, without revealing
it (`realm`: an HMAC of a constant under the secret); a listener that serves no such secret
answers with a proof of none, so the client hears that it does not hold its secret, and one
that served it once answers with zeros (its server closed: the client hears a refusal, as
from a closed listener). Each
side proves it holds the secret over both fresh nonces, so a recorded handshake cannot be
replayed. Every message has a fixed size, so nothing is allocated or unpickled for a peer
that has not proved itself, and a peer that connects and says nothing holds only its own
thread, for `Timing.handshake`.

An address in text (a pipe reader's inlet, see `_route`) is ``<abstract name>`` or
``<abstract name>|<ip>:<port>``. The TCP part exists when the process reaches the pipe's
creator over a network (not loopback), and listens on the address it reaches the creator
from, so writers that reach the same creator can usually reach it too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from fiberexec import _auth
from fiberexec._framing import HEADER, FrameBuffer
from fiberexec._link_stream import connect_abstract
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._errors import AuthenticationError
from fiberexec.multiprocessing._frames import HEAD, Frame

log = logging.getLogger("fiberexec.multiprocessing")

MAGIC = b"FXM3"  # the first bytes of a handshake: what this is, and its version
HAND_OVER = b"FXD1"  # the first bytes of a request for a descriptor (`Listener.descriptors`)
# What a connection is for, named in its handshake (see the module).
RPC, STREAM, PIPE = b"R", b"S", b"P"
Admit = Callable[[socket.socket], None]
_NONCE = 16
_PROOF = 32
_REALM = 8
_GONE = bytes(_NONCE + _PROOF)  # in place of the server's proof: that secret is served no more
TcpAddress = tuple[str, int]
MAX_FRAME = 1 << 31
# A tagged frame's length (`HEADER`), then its tag and channel id (`_frames.HEAD`)
_SIZED_HEAD = struct.Struct(HEADER.format + HEAD.format.lstrip("!"))
_TAGGED = _SIZED_HEAD.size - HEADER.size
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR
_CHUNK = 1 << 16


def outward_ip(endpoint_address: str) -> str | None:
    """The local IP this process reaches ``endpoint_address`` (``tcp://host:port``) from;
    None when that is loopback (every peer that reaches it is then on this host)."""
    parts = urlsplit(endpoint_address)
    if not parts.hostname or parts.port is None:
        return None
    family = socket.AF_INET6 if ":" in parts.hostname else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect((parts.hostname, parts.port))
            ip = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if ipaddress.ip_address(ip).is_loopback else ip


def split_address(address: str) -> tuple[str, TcpAddress | None]:
    """``<abstract name>[|<ip>:<port>]`` as (name, (ip, port) or None)."""
    unix, _, tcp = address.partition("|")
    if not tcp:
        return unix, None
    host, _, port = tcp.rpartition(":")
    return unix, (host.strip("[]"), int(port))


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the connection closed during the handshake")
        data += chunk
    return data


def realm(secret: bytes) -> bytes:
    """What names ``secret`` in a handshake (see the module), revealing nothing of it."""
    return _auth.proof(secret, "mp-realm", b"", b"")[:_REALM]


Services = Mapping[bytes, tuple[bytes, Mapping[bytes, Admit]]]  # realm: secret, services


def _prove_server(sock: socket.socket, realms: Services, gone: set[bytes]) -> Admit:
    """The listening side of the handshake (the module's), after its `MAGIC`: the admit of
    the service asked for; raises if the peer fails it or asks for a service not offered
    here (`_Gone`: for a secret served here before, whose servers have all closed)."""
    asked, nonce_s = _exactly(sock, _REALM + _NONCE + 1), _auth.new_nonce()  # realm, nonce,
    # then the service
    secret, services = realms.get(asked[:_REALM], (b"", {}))
    if not secret and asked[:_REALM] in gone:
        sock.sendall(_GONE)
        raise _Gone("its secret's servers here have closed")
    if not secret:  # a proof of nothing: the peer learns only that we do not hold its secret
        sock.sendall(nonce_s + secrets.token_bytes(_PROOF))
        raise AuthenticationError("it holds none of the secrets this process serves")
    sock.sendall(nonce_s + _auth.proof(secret, "mp-server", asked, nonce_s))
    answer = _exactly(sock, _PROOF)
    if not _auth.verify(_auth.proof(secret, "mp-client", asked, nonce_s), answer):
        with contextlib.suppress(OSError):
            sock.sendall(b"D")
        raise AuthenticationError("wrong proof: it does not hold the secret")
    admit = services.get(asked[-1:])
    if admit is None:
        raise _Unserved(f"it asked for service {asked[-1:]!r}, not offered here")
    sock.sendall(b"K")
    return admit


class _Unserved(AuthenticationError):
    """A peer with the secret asked for a service the listener does not offer: it is told
    so (``b"N"``) once the refusal is counted."""


class _Gone(AuthenticationError):
    """A peer named a secret whose servers here have closed: not a rejection, as a
    connection to a closed listener is none."""


def prove_client(sock: socket.socket, secret: bytes, peer: str, service: bytes) -> None:
    """The dialling side of the handshake, on a connected ``sock`` (its timeout bounds each
    read), for ``service``; ``peer`` names the other side in errors.

    Raises:
        AuthenticationError: the peer does not hold the secret, or refused ours.
        ConnectionRefusedError: the peer does not offer ``service``, or no longer serves
            the secret (its server closed).
        OSError, EOFError: the connection failed or closed.
    """
    asked = realm(secret) + _auth.new_nonce() + service
    sock.sendall(MAGIC + asked)
    answer = _exactly(sock, _NONCE + _PROOF)
    if answer == _GONE:
        raise ConnectionRefusedError(f"{peer} no longer serves this handle's secret (its "
                                     "server has closed)")
    nonce_s, proof = answer[:_NONCE], answer[_NONCE:]
    if not _auth.verify(_auth.proof(secret, "mp-server", asked, nonce_s), proof):
        raise AuthenticationError(f"{peer} failed authentication: it does not hold this "
                                  "handle's secret")
    sock.sendall(_auth.proof(secret, "mp-client", asked, nonce_s))
    reply = _exactly(sock, 1)
    if reply == b"N":
        raise ConnectionRefusedError(f"{peer} holds the secret but serves no {service!r} "
                                     "connections")
    if reply != b"K":
        raise AuthenticationError(f"{peer} refused our proof of the secret")


def dial(secret: bytes, unix: str = "", tcp: TcpAddress | None = None, *, service: bytes,
         timeout: float | None = None) -> socket.socket:
    """An authenticated, blocking connection for ``service``: to the abstract Unix socket
    ``unix`` when this process reaches it, else to ``tcp`` (connect and handshake within
    ``timeout`` each, `Timing.connect` if None).

    Raises:
        AuthenticationError: the peer does not hold the secret, or refused ours.
        OSError, EOFError: no way in (`ConnectionRefusedError` with neither address, or
            when the peer does not offer ``service``).
    """
    timeout = _timing.TIMING.connect if timeout is None else timeout
    sock = connect_abstract(unix, timeout) if unix and sys.platform == "linux" else None
    if sock is None:
        if tcp is None:
            raise ConnectionRefusedError(f"cannot reach {unix!r} from here, and it has no "
                                         "TCP address")
        sock = socket.create_connection(tcp, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer = f"{tcp[0]}:{tcp[1]}" if sock.family != socket.AF_UNIX and tcp else (
        f"@{unix.lstrip(chr(0))}")  # an abstract socket, as ss and netstat show one
    try:
        sock.settimeout(timeout)
        prove_client(sock, secret, peer, service)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


def _too_large(size: int) -> None:
    raise ValueError(f"a message of {size} bytes is over the {MAX_FRAME}-byte limit of one "
                     "frame; send large data in pieces, or through shared memory")


class Wire:
    """An authenticated connection's frames, framed as the executor's links frame theirs
    (`fiberexec._framing`: a 4-byte length, then the frame's bytes); a tagged frame
    (`send`, the streams' and routes' `_frames`) begins with a 1-byte tag and an 8-byte
    channel id. Read in large chunks (one system call brings every frame that has arrived),
    written in one call each (two for a large one). One thread reads at a time; sends may
    come from any thread while another reads (callers serialise their sends)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(None)
        self._reader = FrameBuffer(MAX_FRAME)
        self._ready: deque[bytes] = deque()  # frames read, not yet taken
        self._poller = select.poll()  # the socket, and the ``wake`` of the last `poll`
        self._poller.register(self.sock, _READABLE)
        self._wake: int | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frame: Frame) -> None:
        """Send a typed frame (`_frames`) with a single copy and system call (two for a
        large one)."""
        body = frame.body()
        size = _TAGGED + len(body)
        if size > MAX_FRAME:
            _too_large(size)
        if size < _CHUNK:
            self.sock.sendall(_SIZED_HEAD.pack(size, frame.TAG, frame.cid) + body)
        else:
            self.sock.sendall(_SIZED_HEAD.pack(size, frame.TAG, frame.cid))
            self.sock.sendall(body)

    def send_parts(self, parts: list[bytes | memoryview]) -> None:
        """Send one frame made of ``parts``; small frames in one write."""
        size = sum(map(len, parts))
        if size > MAX_FRAME:
            _too_large(size)
        if size <= _CHUNK:
            self.sock.sendall(b"".join([HEADER.pack(size), *parts]))
            return
        self.sock.sendall(HEADER.pack(size))
        for part in parts:
            self.sock.sendall(part)

    def frame_ready(self) -> bool:
        """Whether a whole frame has been read (`recv_bytes` returns it at once)."""
        return bool(self._ready)

    def poll(self, timeout: float | None, wake: int | None = None) -> bool:
        """Whether a frame has begun to arrive (or the stream ended), waiting up to
        ``timeout`` (None: forever); a readable ``wake`` descriptor ends the wait early."""
        if self._ready:
            return True
        if wake != self._wake:  # one reader at a time: only the current wake is watched
            if self._wake is not None:
                self._poller.unregister(self._wake)
            if wake is not None:
                self._poller.register(wake, _READABLE)
            self._wake = wake
        ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
        mine = self.sock.fileno()
        return any(fd == mine for fd, _ in self._poller.poll(ms))

    def recv_bytes(self) -> bytes:
        """The next frame (blocking); EOFError when the other end closed."""
        ready = self._ready
        if ready:
            return ready.popleft()
        while True:
            frames = self._reader.read(self.sock)
            if frames is None:
                raise EOFError
            if len(frames) == 1:
                return frames[0]
            if frames:
                ready.extend(frames)
                return ready.popleft()

    def shutdown(self) -> None:
        """End the connection, waking a thread blocked reading it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


class Signal:
    """A file descriptor that is readable exactly while it is set: what a pipe end's
    ``fileno()`` returns, so `select`, selectors and `multiprocessing.connection.wait`
    see it ready when ``recv()`` would not block."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.on = False

    def set(self, on: bool) -> None:
        if on and not self.on:
            os.write(self.w, b"!")
        elif not on and self.on:
            with contextlib.suppress(BlockingIOError):
                os.read(self.r, 64)
        self.on = on

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


class Wake(Signal):
    """One thread's wake-up descriptor while it leads a `Reader`: set by whoever else makes
    what it waits for ready (an item, or end-of-file)."""

    def __init__(self) -> None:
        super().__init__()
        self.owner = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() != self.owner:  # the leader itself needs no wake-up
            self.set(True)

    def __del__(self) -> None:
        self.close()


_wakes = threading.local()


def thread_wake() -> Wake:
    """This thread's `Wake`, unset (closed when the thread ends)."""
    wake: Wake | None = getattr(_wakes, "wake", None)
    if wake is None:
        wake = _wakes.wake = Wake()
    wake.set(False)
    return wake


_ONESHOT = getattr(select, "EPOLLONESHOT", 0)
_ARMED = getattr(select, "EPOLLIN", 0) | _ONESHOT


class Reader:
    """Which thread reads a stream or a route: the one rule of this layer (a call's caller
    reads its own answer, `_rpc`: the same rule, with no other reader).

    Frames are read by one thread at a time, the holder of ``role``. A thread waiting for
    what the connection brings takes the role and reads the socket itself (`lead`), so a
    message reaches the thread that waits for it with no thread in between: the path the
    standard library's socket pipe takes. Otherwise the connection's serving thread reads
    it (`run`, or `start` for a thread of its own), which waits in an epoll set without
    holding the role. While a thread leads, the socket is out of that set (one-shot), and
    given back `Timing.hold` after the last read or `hold` (so a thread that asks and reads
    answer after answer pays no system call per answer to take it out and put it back); a
    frame for anything else is applied by whoever reads it (``apply(frame)``), and one that
    nobody waits for may wait up to about `Timing.hold`. ``lost()`` runs once, when the
    connection ends (its other end closed, a socket error, a frame ``apply`` refused).
    """

    def __init__(self, conn: Wire, apply: Callable[[bytes], None],
                 lost: Callable[[], None], clock: _timing.Clock = time.monotonic) -> None:
        self.conn = conn
        self.clock = clock
        self.apply = apply
        self.lost = lost
        self.role = threading.Lock()  # held by the one thread reading the socket
        self.serving = False  # a serving thread reads whatever no leader reads
        self.ended = False  # nobody reads it any more
        self._life = threading.Lock()  # guards the two above's start and `_finished`
        self._finished = False
        self.poller: Any = None  # the serving thread's epoll set: the socket and ``kick``
        self.kick: Signal | None = None  # wakes the serving thread to check holds
        self.held: float | None = None  # since when the socket is kept from the serving
        # thread (by `hold`, or after a `lead`); None while it watches it or a leader reads
        self.holding_until = 0.0  # the serving thread checks holds until then (see `_serve`)

    @property
    def leadable(self) -> bool:
        """Whether a thread may read the socket itself now (see the class): not once it
        ended, nor where no epoll lets the serving thread step aside."""
        return not self.ended and (self.poller is not None or not self.serving)

    def start(self, name: str) -> None:
        """Start a serving thread (once): from now on frames nobody waits for are read as
        they come."""
        if self._begin():
            threading.Thread(target=self._run, name=name, daemon=True).start()

    def run(self) -> None:
        """Serve in this thread (see `start`) until the connection ends."""
        if self._begin():
            self._run()

    def _begin(self) -> bool:
        with self._life:
            if self.serving or self._finished:
                return False
            self.serving = True
            if _ONESHOT:
                self.kick = Signal()
                poller = select.epoll(2)
                poller.register(self.conn.fileno(), _ARMED)
                poller.register(self.kick.r, select.EPOLLIN)
                self.poller = poller
            return True

    def _run(self) -> None:
        """The serving thread's body: read until the connection ends, then ``lost()``
        (once a leader has finished its frame) and close."""
        try:
            self._serve()
        except (EOFError, OSError):
            pass
        except Exception:
            log.exception("a connection sent a frame this process could not apply; closing it")
        finally:
            with self.role:  # a leader finishes its frame first
                self.ended = True
            self._finish()

    def _finish(self) -> None:
        with self._life:
            if self._finished:
                return
            self._finished = True
        self.ended = True
        self.lost()
        self.close()

    def _arm(self, events: int) -> None:
        if self.poller is not None:
            with contextlib.suppress(OSError, ValueError):  # closed: the connection ended
                self.poller.modify(self.conn.fileno(), events)

    def _drain(self) -> None:
        """Read and apply a frame, and every other whole frame at hand."""
        self.apply(self.conn.recv_bytes())
        while self.conn.frame_ready():
            self.apply(self.conn.recv_bytes())

    def _serve(self) -> None:
        if self.poller is None:  # no epoll: this thread is the only reader
            with self.role:
                while True:
                    self.apply(self.conn.recv_bytes())
        while True:
            timeout = _timing.TIMING.hold if self.clock() < self.holding_until else -1
            readable = False
            for fd, _ in self.poller.poll(timeout):
                if self.kick is not None and fd == self.kick.r:
                    self.kick.set(False)
                else:
                    readable = True
            held = self.held
            if held is None and not readable:
                continue  # a timeout or a kick: only an expired hold needs this thread
            if held is not None and self.clock() - held < _timing.TIMING.hold:
                continue  # a thread here reads answers from this peer (see `_keep`)
            if not self.role.acquire(blocking=False):
                continue  # a leader reads; it arms the socket again when it lets go
            self.held = None
            try:
                if self.conn.frame_ready() or self.conn.poll(0):
                    self._drain()
            finally:
                self.role.release()
                self._arm(_ARMED)

    def lead(self, wake: Wake | None, timeout: float | None, keep: bool = True) -> None:
        """Read frames in the calling thread (which holds ``role``) until one was applied,
        ``wake`` is set, or ``timeout`` passes; then let go of the role, and unless not
        ``keep``, keep the socket from the serving thread a little longer."""
        if self.held is None:
            self._arm(_ONESHOT)  # the serving thread stops watching
        self.held = None
        ended = False
        try:
            if self.conn.poll(timeout, None if wake is None else wake.r):
                self._drain()
        except (EOFError, OSError):
            ended = True
        except Exception:
            log.exception("a connection sent a frame this process could not apply; closing it")
            ended = True
        finally:
            if ended:
                self.conn.shutdown()  # a serving thread sees the end and cleans up
                keep = False
            # the socket stays out of the serving thread's set for `hold` more: a thread
            # that reads one answer after another (a request loop) then pays no system
            # call to take it out and put it back each time; the serving thread takes it
            # back once nobody has led or held it for that long
            if keep and self.poller is not None:
                self._keep(self.clock())
            self.role.release()
            if not keep:
                self._arm(_ARMED)
        if ended and not self.serving:
            self._finish()

    def try_lead(self, cond: threading.Condition, wake: Wake | None, timeout: float | None,
                 keep: bool = True) -> bool:
        """Unless another thread reads the socket now, `lead` in this one, with ``cond``
        (which the caller holds) released meanwhile; False if it cannot."""
        if not (self.leadable and self.role.acquire(blocking=False)):
            return False
        cond.release()
        try:
            self.lead(wake, timeout, keep)
        finally:
            cond.acquire()
        return True

    def _keep(self, now: float) -> None:
        """Keep the (disarmed) socket from the serving thread until ``now + Timing.hold``."""
        self.held = now
        waits_forever = now >= self.holding_until
        # (set before the kick: the thread reads it)
        self.holding_until = now + 100 * _timing.TIMING.hold
        if waits_forever and self.kick is not None:  # it waits without a timeout: wake it
            self.kick.set(True)

    def hold(self) -> None:
        """A thread here is about to send the peer something it answers, then read the
        answer (a duplex pipe end, see `_channels.Channels.expect`): take the socket from the
        serving thread now, so that the answer is not read there first and handed over.
        The serving thread takes it back if no thread has come to read within
        `Timing.hold`."""
        if not self.leadable or self.role.locked():
            return
        now = self.clock()
        if self.held is None:
            self._arm(_ONESHOT)
        self._keep(now)

    def unhold(self) -> None:
        """Give a held socket back to the serving thread now (see `hold`)."""
        if self.held is not None:
            self.held = None
            if not self.role.locked():
                self._arm(_ARMED)

    def close(self) -> None:
        self.ended = True
        for part in (self.kick, self.poller, self.conn):
            if part is not None:
                with contextlib.suppress(OSError):
                    part.close()


def half_close(sock: socket.socket) -> bool:
    """End what this process sends on ``sock`` (a FIN after its last byte) if it is TCP,
    and say whether it was: the caller then reads on until its peer closes. A TCP socket
    closed with bytes of its peer's unread is reset instead, and the kernel drops what it
    had not yet sent (as it does for a closed one that still gets data): the last frames,
    on a slow link. A Unix socket hands over what was written as it is written."""
    if sock.family == socket.AF_UNIX:
        return False
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    return True


def drop(sock: socket.socket) -> None:
    """Close ``sock``, waking any thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class Listener:
    """Where peers connect (see the module): an abstract Unix socket on Linux, and TCP on
    each host `listen_tcp` names (port 0: any free one).

    A process has one (`shared`): its broker's calls and streams, a manager's calls and
    its pipe readers' writers all come in through it, each connection naming its secret's
    realm and its service in the handshake. Each connection gets a thread of its own, which
    runs the handshake and then the admit of the service it asked for (`offer`), with a
    blocking socket; a connection whose handshake fails is counted in ``rejected``, logged,
    and closed. ``what`` names the listener in that log line.

    One that opens with `HAND_OVER` on the Unix socket instead asks for a descriptor this
    process shares (`_hostpipe`): ``descriptors`` serves it, with no handshake (the key it
    names is the capability).
    """

    def __init__(self, *, what: str, unix: bool = True) -> None:
        self.what = what
        self.pid = os.getpid()
        self.rejected = 0
        self.unix = ""  # the abstract socket's name (with its leading NUL), or none
        self.closed = False
        self.realms: dict[bytes, tuple[bytes, dict[bytes, Admit]]] = {}  # see `Services`
        self.descriptors: Admit | None = None
        self.gone: set[bytes] = set()  # realms whose every service was withdrawn
        self._lock = threading.Lock()
        self._pending: set[socket.socket] = set()  # connections still in the handshake
        self._sockets: list[socket.socket] = []
        self._tcp: dict[str, tuple[socket.socket, set[object]]] = {}  # host: socket, users
        if unix and sys.platform == "linux":
            self.unix = f"\0fiberexec-mp-{os.getpid()}-{secrets.token_hex(8)}"
            self._listen(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), self.unix)

    def _listen(self, sock: socket.socket, address: str | TcpAddress) -> None:
        try:
            sock.bind(address)
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._sockets.append(sock)
        threading.Thread(target=self._accept, args=(sock,), daemon=True,
                         name="fiberexec-mp-accept").start()

    def listen_tcp(self, host: str, user: object) -> int:
        """Listen on TCP on ``host`` too, for ``user`` (a service: `withdraw` ends it once
        no other user is left): the port, the same for every user of ``host``.

        Raises:
            OSError: cannot listen there.
        """
        with self._lock:
            found = self._tcp.get(host)
            if found is None:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                self._listen(sock, (host, 0))
                found = self._tcp[host] = (sock, set())
            found[1].add(user)
            return int(found[0].getsockname()[1])

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                if self.closed:
                    drop(sock)
                    return
                self._pending.add(sock)
            threading.Thread(target=self._handshake, args=(sock,), daemon=True,
                             name="fiberexec-mp-conn").start()

    def _handshake(self, sock: socket.socket) -> None:
        try:
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(_timing.TIMING.handshake)
            opening = _exactly(sock, len(MAGIC))
            if (opening == HAND_OVER and self.descriptors is not None
                    and sock.family == socket.AF_UNIX):  # (descriptors pass only there)
                admit = self.descriptors
            elif opening == MAGIC:
                admit = _prove_server(sock, self.realms, self.gone)
                sock.settimeout(None)
            else:
                raise AuthenticationError(f"it opened with {opening!r}, not a handshake")
        except (OSError, EOFError, AuthenticationError) as exc:
            with self._lock:
                self._pending.discard(sock)
                closed = self.closed or isinstance(exc, _Gone)
                self.rejected += not closed
            if isinstance(exc, _Unserved):
                with contextlib.suppress(OSError):
                    sock.sendall(b"N")
            if not closed:
                log.warning("rejected a connection to %s: %s", self.what,
                            exc or type(exc).__name__)
            drop(sock)
            return
        with self._lock:
            self._pending.discard(sock)
            if self.closed:
                drop(sock)
                return
        admit(sock)

    def offer(self, secret: bytes, service: bytes, admit: Admit) -> None:
        """Admit connections from peers holding ``secret`` for ``service`` from now on."""
        key = realm(secret)
        with self._lock:
            self.gone.discard(key)
            self.realms.setdefault(key, (secret, {}))[1][service] = admit

    def withdraw(self, secret: bytes, service: bytes) -> None:
        """Admit no more connections for ``service`` of ``secret``, and stop listening on
        the TCP hosts only it used."""
        key = realm(secret)
        with self._lock:
            services = self.realms.get(key, (b"", {}))[1]
            services.pop(service, None)
            if not services and self.realms.pop(key, None) is not None:
                self.gone.add(key)
            user = (key, service)
            for host in [h for h, (_, users) in self._tcp.items() if users == {user}]:
                sock = self._tcp.pop(host)[0]
                self._sockets.remove(sock)
                drop(sock)
            for _, users in self._tcp.values():
                users.discard(user)

    def close(self) -> None:
        """Stop listening; connections still in their handshake close too (admitted ones
        belong to whoever admitted them)."""
        with self._lock:
            self.closed = True
            pending, self._pending = list(self._pending), set()
        for sock in (*self._sockets, *pending):
            drop(sock)


def tcp_text(host: str, port: int) -> str:
    """``<host>:<port>``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Offer:
    """One service of one secret on this process's listener (`shared`)."""

    def __init__(self, listener: Listener, secret: bytes, service: bytes) -> None:
        self.listener = listener
        self.secret = secret
        self.service = service

    @property
    def unix(self) -> str:
        return self.listener.unix

    def listen_tcp(self, host: str) -> int:
        """Reachable over TCP on ``host`` too: the port (see `Listener.listen_tcp`)."""
        return self.listener.listen_tcp(host, (realm(self.secret), self.service))

    def withdraw(self) -> None:
        """Admit no more connections for it; the listener closes when nothing is offered."""
        with _shared_lock:
            self.listener.withdraw(self.secret, self.service)
            if not self.listener.realms and self.listener.descriptors is None:
                self.listener.close()


_shared: Listener | None = None  # this process's listener
_shared_lock = threading.Lock()


def _here() -> Listener:
    """This process's listener (under `_shared_lock`): started on first use, and after a
    fork in the child."""
    global _shared
    if _shared is None or _shared.closed or _shared.pid != os.getpid():
        _shared = Listener(what=f"process {os.getpid()} (a broker, a manager or a pipe's "
                                "reader)")
    return _shared


def shared(secret: bytes, service: bytes, admit: Admit) -> Offer:
    """``service`` for peers holding ``secret``, offered on this process's listener (it
    closes when the last offer is withdrawn, unless it shares descriptors)."""
    with _shared_lock:
        here = _here()
        here.offer(secret, service, admit)
        return Offer(here, secret, service)


def share_descriptors(hand_over: Admit) -> str:
    """Serve requests for descriptors (`HAND_OVER`) with ``hand_over``, on this process's
    listener from now on, as long as the process lives: the listener's abstract name."""
    with _shared_lock:
        here = _here()
        here.descriptors = hand_over
        return here.unix
