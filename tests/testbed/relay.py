"""A delaying TCP relay: adds a fixed one-way delay to connections into the executor host.

The kernel here has no ``netem`` qdisc, so delay cannot be added per packet. Instead an
nftables rule in the executor host redirects every new incoming TCP connection to this relay
(``redirect``); the relay reads the original destination (``SO_ORIGINAL_DST``), connects to
it on the host itself, and forwards bytes both ways, holding each chunk it reads for
``delay`` seconds before writing it on. So the delay applies per *segment read* (whatever
one ``recv`` returned: one packet or several coalesced ones), not per packet: a burst that
arrives together is delayed together, and no reordering or jitter is emulated. A round trip
through the relay costs ``2 * delay`` more than without it.

Run inside the executor host's namespace::

    python -m tests.testbed.relay --listen 10.99.0.1:7000 --delay 0.0025

It prints ``relay listening`` once it accepts connections, and exits on SIGTERM or when its
stdin closes (so it never outlives the test that started it).
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import socket
import struct
import sys
import threading
import time

SO_ORIGINAL_DST = 80
CHUNK = 256 * 1024
_END = b""


def original_destination(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Read ``src``; a writer thread sends each chunk ``delay`` seconds after it was read."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def writer() -> None:
        while True:
            due, data = held.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the relay's whole purpose is to wait this long
            if data is _END:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    while True:
        try:
            data = src.recv(CHUNK)
        except OSError:
            data = _END
        held.put((time.monotonic() + delay, data or _END))
        if not data:
            break
    thread.join()


def _serve(conn: socket.socket, delay: float) -> None:
    try:
        upstream = socket.create_connection(original_destination(conn), timeout=10)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)
    for sock in (conn, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    there = threading.Thread(target=_pump, args=(conn, upstream, delay), daemon=True)
    there.start()
    _pump(upstream, conn, delay)
    there.join()
    conn.close()
    upstream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="host:port to accept on")
    parser.add_argument("--delay", type=float, required=True, help="one-way delay, seconds")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    server = socket.create_server((host, int(port)), backlog=512)
    threading.Thread(target=_accept, args=(server, args.delay), daemon=True).start()
    print("relay listening", flush=True)
    sys.stdin.read()  # returns when the parent closes our stdin or dies


def _accept(server: socket.socket, delay: float) -> None:
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn, delay), daemon=True).start()


if __name__ == "__main__":
    main()
