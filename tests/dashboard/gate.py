"""A loopback listener that tasks block on: the test learns a task started (it connects) and
lets it finish (closes the connection), without sleeping."""

from __future__ import annotations

import socket
from types import TracebackType


class Gate:
    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []

    def arrived(self, timeout: float = 60) -> None:
        """Wait until one more task is blocked on the gate."""
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        self.held.append(conn)

    def release(self) -> None:
        for conn in self.held:
            conn.close()
        self.held.clear()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.release()
        self.listener.close()
