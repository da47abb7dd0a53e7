"""An executor in a process of its own, for tests that kill it.

    python -m tests.ssh.executor_program WORKERS OPTIONS_JSON CERT KEY

Starts WORKERS workers on the ssh backend (``OPTIONS_JSON``: SSHBackend arguments) with TLS,
gives each a long task, prints ``ready <executor id>`` once every worker has connected, and
then waits to be killed.
"""

from __future__ import annotations

import json
import logging
import sys
import threading

from fiberexec import FiberExecutor, TLSOptions
from tests import tasks


class _Connected(logging.Handler):
    def __init__(self, count: int) -> None:
        super().__init__(logging.INFO)
        self.count, self.all = count, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "connected" in record.getMessage():
            self.count -= 1
            if self.count <= 0:
                self.all.set()


def main() -> None:
    workers, options, cert, key = int(sys.argv[1]), json.loads(sys.argv[2]), *sys.argv[3:5]
    logger = logging.getLogger("fiberexec")
    logger.setLevel(logging.INFO)
    connected = _Connected(workers)
    logger.addHandler(connected)
    ex = FiberExecutor(workers, backend="ssh", backend_options=options, heartbeat=0.5,
                       tls=TLSOptions(cert, key))
    futures = [ex.submit(tasks.sleep_return, 120) for _ in range(workers)]
    if not connected.all.wait(120):
        raise SystemExit("workers did not connect within 120 s")
    print("ready", ex.executor_id, flush=True)  # type: ignore[union-attr]
    futures[0].result(timeout=600)  # killed long before this returns


if __name__ == "__main__":
    main()
