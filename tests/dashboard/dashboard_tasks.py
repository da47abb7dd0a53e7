"""Tasks the dashboard's tests run on real workers (importable, so workers load them)."""

from __future__ import annotations

import socket
import time


def wait_for_release(port: int) -> str:
    """Connect to the test's `Gate` and block until it lets go (it closes the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.settimeout(120)
        conn.recv(1)  # b"" once the test closes its end; socket.timeout if it never does
    return "released"


def fail_with(message: str) -> None:
    raise ValueError(message)


def brief(seconds: float) -> float:
    """A short task, so the stream and the rate plots have something to show."""
    time.sleep(seconds)
    return seconds
