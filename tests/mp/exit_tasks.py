"""Process targets for the tests of how a process starts and ends (importable by children)."""

from __future__ import annotations

import threading
import time
from typing import Any


class Target:
    """A target object whose collection a test can watch."""

    def __call__(self) -> None:
        pass


def set_later(event: Any, delay: float) -> None:
    """Start a thread that is not a daemon, which sets ``event`` after ``delay``, and return."""
    threading.Thread(target=lambda: (time.sleep(delay), event.set())).start()


def report_log_level(conn: Any) -> None:
    import multiprocessing

    conn.send(multiprocessing.get_logger().getEffectiveLevel())
    conn.close()


def report_parent(conn: Any) -> None:
    import multiprocessing

    parent = multiprocessing.parent_process()
    conn.send(None if parent is None else parent.pid)
    conn.close()


class Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("this object refuses to be pickled")


def identity(x: Any) -> Any:
    return x


def bump(lock: Any, value: Any, conn: Any, n: int) -> None:
    """Add 1 to ``value`` ``n`` times under ``lock``, then send the value through ``conn``."""
    for _ in range(n):
        with lock:
            value.value += 1
    conn.send("done")
    conn.close()


def _refuse() -> None:
    raise RuntimeError("this object refuses to be unpickled")


class UnpicklableThere:
    """Pickles, but fails to unpickle (in the child)."""

    def __reduce__(self) -> Any:
        return (_refuse, ())
