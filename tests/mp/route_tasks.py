"""Process targets for the direct-pipe tests (importable by spawned children)."""

from __future__ import annotations

import os
import time
from typing import Any


def send_paced(conn: Any, n: int, every: int, pause: float) -> None:
    """Send 0..n-1, pausing ``pause`` after every ``every`` items, then close."""
    for i in range(n):
        conn.send(i)
        if i % every == every - 1:
            time.sleep(pause)
    conn.close()


def read_to_eof(conn: Any, out: Any, slowly: bool = False, progress: Any = None) -> None:
    """Put every item received until end-of-file; ``slowly``: slower than a writer that
    sends as fast as it can; ``progress``: an event set once 500 items came."""
    got = []
    while True:
        try:
            got.append(conn.recv())
        except EOFError:
            break
        if progress is not None and len(got) == 500:
            progress.set()
        if slowly and len(got) % 100 == 0:
            time.sleep(0.002)
    out.put(got)


def double_until_eof(conn: Any) -> None:
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        conn.send(item * 2)


def ask_and_check(conn: Any, n: int, out: Any) -> None:
    """``n`` round trips with a pause now and then; put how many answers were wrong."""
    wrong = 0
    for i in range(n):
        conn.send(i)
        if conn.recv() != i * 2:
            wrong += 1
        if i % 50 == 49:
            time.sleep(0.005)
    conn.close()
    out.put(wrong)


def send_until_direct(conn: Any, n: int, out: Any) -> None:
    """Send 0..n-1 slowly until this process sends the pipe directly to its reader (or 10 s
    passed), then the rest at once; put whether it got there (fiberexec only)."""
    direct = _send_until_direct(conn, n)
    conn.close()
    out.put(direct)


def _send_until_direct(conn: Any, n: int) -> bool:
    from fiberexec.multiprocessing import _route, _stream

    (stream,) = _stream._streams.values()
    deadline = time.monotonic() + 10
    direct = False
    for i in range(n):
        conn.send(i)
        if not direct and time.monotonic() < deadline:
            route = stream.outlets.routes.get(conn._send_id)
            direct = isinstance(route, _route.Route) and route.direct
            time.sleep(0 if direct else 0.01)
    return direct


def where() -> str:
    """This process's address toward its parent's broker, or "local" (loopback)."""
    from fiberexec.multiprocessing import _backends, _links

    return _links.outward_ip(os.environ[_backends.ENV_PARENT_ADDRESS]) or "local"


def send_until_direct_saying_how(conn: Any, n: int, out: Any) -> None:
    """`send_until_direct`, then put (sent directly, the link's socket family, `where`); a
    pipe of this host (`_hostpipe`) puts "descriptor" for both: no broker, no route."""
    from fiberexec.multiprocessing import _stream
    from fiberexec.multiprocessing._hostpipe import HostConnection

    if isinstance(conn, HostConnection):
        for i in range(n):
            conn.send(i)
        conn.close()
        out.put("descriptor")
        out.put(("descriptor", where()))
        return

    send_until_direct(conn, n, out)
    (stream,) = _stream._streams.values()
    links = [link for link in stream.outlets.links.values() if not link.closed]
    family = links[0].wire.sock.family.name if links else "none"
    out.put((family, where()))


def read_to_eof_saying_where(conn: Any, out: Any) -> None:
    read_to_eof(conn, out, True)
    out.put(where())


def route_state(q: Any) -> str:
    """How this process sends to queue ``q``: ``direct`` (to its consumer), ``relay``
    (through its creator), or ``stdlib`` (the standard library's queue)."""
    if not type(q).__module__.startswith("fiberexec"):
        return "stdlib"
    from fiberexec.multiprocessing import _route, _stream

    stream = _stream.stream_for(q._ep())
    route = stream.outlets.routes.get(q._cid) if stream and stream.outlets else None
    direct = isinstance(route, _route.Route) and route.state == _route.DIRECT
    return "direct" if direct else "relay"


def put_paced(  # noqa: PLR0917  # a Process target takes positional args
        q: Any, n: int, done: Any, tag: Any = None, hold: Any = None,
        warnings: bool = False) -> None:
    """Put 0..n-1 (as ``(tag, i)`` if ``tag``) over about half a second, report how the
    last went (`route_state`), then, if ``hold``, stay alive until it is set.
    ``warnings``: fiberexec's warnings go to stderr (`fiberexec.enable_logging`)."""
    if warnings:
        import fiberexec

        fiberexec.enable_logging("WARNING")
    for i in range(n):
        q.put(i if tag is None else (tag, i))
        if i % 20 == 19:
            time.sleep(0.01)
    done.put(route_state(q))
    if hold is not None:
        hold.wait(60)


def put_in_two_parts(  # noqa: PLR0917  # a Process target takes positional args
        q: Any, first: int, n: int, go: Any, done: Any, hold: Any) -> None:
    """Put 0..first-1 at once, report, wait for ``go``, put first..n-1 (paced), report
    how the last went, then stay alive until ``hold`` is set."""
    for i in range(first):
        q.put(i)
    done.put("part one")
    go.wait(60)
    for i in range(first, n):
        q.put(i)
        if i % 20 == 19:
            time.sleep(0.01)
    done.put(route_state(q))
    hold.wait(60)


def take_one_then_rest(q: Any, got: Any, resume: Any, n: int) -> None:
    """Take one item and report it; once ``resume`` is set, take n - 1 more; report all."""
    first = q.get(timeout=60)
    got.put(first)
    resume.wait(60)
    got.put([first, *(q.get(timeout=60) for _ in range(n - 1))])


def counting(q: Any) -> str:
    """How this consumer tells the producers that send ``q`` here directly what it took:
    ``counted`` (in its tally page, which they read), ``taken`` (a message per item) or
    ``stdlib`` (the standard library's queue)."""
    if not type(q).__module__.startswith("fiberexec"):
        return "stdlib"
    from fiberexec.multiprocessing import _stream

    stream = _stream.stream_for(q._ep())
    flows = stream.inlet.flows.get(q._cid, {}) if stream and stream.inlet else {}
    return "counted" if flows and all(f.counted for f in flows.values()) else "taken"


def pid_namespace() -> str:
    """This process's PID namespace (another process can map its tally page only from the
    same one)."""
    return os.readlink("/proc/self/ns/pid")


def take_one_then_some(q: Any, got: Any, resume: Any, n: int, stop: Any) -> None:
    """Take one item and report it; once ``resume`` is set, take ``n`` more and report
    them, `counting` and `pid_namespace`; then stay alive, taking no more, until ``stop``."""
    got.put(q.get(timeout=60))
    resume.wait(60)
    got.put(([q.get(timeout=60) for _ in range(n)], counting(q), pid_namespace()))
    stop.wait(60)


def put_paced_saying_where(q: Any, n: int, done: Any, hold: Any) -> None:
    """`put_paced`, reporting its `pid_namespace` as well as how the last put went."""
    put_paced(q, n, done, None, None)
    done.put(pid_namespace())
    hold.wait(60)


def queue_of_its_own(out: Any, stop: Any) -> None:
    """Make a queue here (so this process's broker starts), send it through ``out``, put
    one item on it, and stay until ``stop`` (the queue lives as long as its creator)."""
    import fiberexec.multiprocessing as fmp

    own = fmp.Queue()
    out.put(own)
    own.put("from the child")
    stop.wait(60)


def send_until_direct_then_burst(conn: Any, n: int, burst: int, size: int,
                                 out: Any) -> None:
    """Send 0..n-1 until this process sends the pipe directly to its reader (fiberexec's
    pipe between hosts; elsewhere all at once), then ``burst`` messages of ``size`` bytes
    as fast as it can, close, put whether it went directly, and end at once."""
    direct = False
    if hasattr(conn, "_send_id"):  # a pipe through a broker: it goes directly at some point
        direct = _send_until_direct(conn, n)
    else:
        for i in range(n):
            conn.send(i)
    for i in range(burst):
        conn.send(bytes([i % 256]) * size)
    conn.close()
    out.put(direct)


def read_to_eof_in_short(conn: Any, out: Any, after: int, work: int) -> None:
    """Put what came until end-of-file, each message of bytes as (its first byte, its
    length); after ``after`` messages, compute for a while holding the interpreter's lock
    (``sum(range(work))`` is one C loop: this process's other threads wait it out)."""
    got: list[Any] = []
    while True:
        try:
            item = conn.recv()
        except EOFError:
            break
        got.append((item[0], len(item)) if isinstance(item, bytes) else item)
        if len(got) == after:
            sum(range(work))
    out.put(got)
