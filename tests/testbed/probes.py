"""Small network programs the test bed's self-tests run inside a host's namespace.

    python -m tests.testbed.probes udp-echo ADDRESS PORT     echo every datagram back
    python -m tests.testbed.probes tcp-sink ADDRESS PORT     read all, answer the byte count
    python -m tests.testbed.probes tcp-pingpong ADDRESS PORT N
        connect, do N one-byte round trips, print the median round trip in seconds

Servers print ``ready`` once listening and exit when their stdin closes.
"""

from __future__ import annotations

import socket
import statistics
import sys
import threading
import time


def udp_echo(address: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((address, port))

    def serve() -> None:
        while True:
            data, peer = sock.recvfrom(2048)
            sock.sendto(data, peer)

    threading.Thread(target=serve, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()


def tcp_sink(address: str, port: int) -> None:
    server = socket.create_server((address, port))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            total = 0
            while chunk := conn.recv(1 << 20):
                total += len(chunk)
            conn.sendall(str(total).encode())
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()


def tcp_pingpong(address: str, port: int, count: int) -> None:
    with socket.create_connection((address, port), timeout=10) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(count):
            start = time.perf_counter()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise SystemExit("the echo server closed early")
            rtts.append(time.perf_counter() - start)
    print(statistics.median(rtts), flush=True)


def main() -> None:
    kind, address, port, *rest = sys.argv[1:]
    if kind == "udp-echo":
        udp_echo(address, int(port))
    elif kind == "tcp-sink":
        tcp_sink(address, int(port))
    elif kind == "tcp-pingpong":
        tcp_pingpong(address, int(port), int(rest[0]))
    else:
        raise SystemExit(f"unknown probe {kind!r}")


if __name__ == "__main__":
    main()
