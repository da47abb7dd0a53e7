"""A process whose broker (the holder of a queue or pipe) died: every wait ends in an error.

A blocking call to a queue, simple queue or pipe held by a process that is gone raises an
`OSError` (`ConnectionError`) naming that process, or `EOFError` where the standard library
gives it; it never hangs. A process that dies without closing its connections (its host or
container vanished; here: it is stopped) is found by the liveness check of `_rpc`.

A pipe whose ends stay on one host (`_hostpipe`) is the standard library's socket pipe: the
end of the process at its other end is end-of-file for `recv` and a broken pipe for `send`,
and a stopped process is a slow one (`poll` with a timeout bounds the wait), as there.
"""

from __future__ import annotations

import dataclasses
import queue
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fiberexec.multiprocessing as mp
from fiberexec.multiprocessing import _timing
from fiberexec.multiprocessing._hostpipe import HostConnection
from fiberexec.multiprocessing.managers import BaseManager
from tests.mp import tasks

pytestmark = pytest.mark.timeout(60)


def test_simple_queue_get_honours_its_timeout_here_and_in_a_child() -> None:
    sq = mp.SimpleQueue()
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        sq.get(timeout=0.2)
    with pytest.raises(queue.Empty):
        sq.get(block=False)
    assert time.monotonic() - start < 5
    out = mp.Queue()
    p = mp.Process(target=tasks.simple_get_with_timeout, args=(sq, out))
    p.start()
    what, took = out.get(timeout=30)
    assert what == "empty" and took < 5
    p.join(30)


def _unimportable() -> None:
    """Pickles by reference to a module that only this process has."""


def test_manager_whose_server_dies_starting_raises_instead_of_waiting() -> None:
    module = types.ModuleType("fiberexec_only_in_the_test_process")
    _unimportable.__module__ = module.__name__
    module._unimportable = _unimportable  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module

    class Manager(BaseManager):
        pass

    Manager.register("Thing", _unimportable)
    start = time.monotonic()
    try:
        with pytest.raises(mp.ProcessError, match="did not start"):
            Manager(start_timeout=40).start()
    finally:
        del sys.modules[module.__name__]
    assert time.monotonic() - start < 30


def _blocked(calls: dict[str, Callable[[], Any]]) -> tuple[dict[str, Any], Callable[[], None]]:
    """Run each call in a thread; the returned function waits for them (bounded)."""
    results: dict[str, Any] = {}
    threads = []
    for name, fn in calls.items():
        def run(name: str = name, fn: Callable[[], Any] = fn) -> None:
            try:
                results[name] = fn()
            except BaseException as exc:
                results[name] = exc
        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()

    def join() -> None:
        for thread in threads:
            thread.join(30)
        assert not [t for t in threads if t.is_alive()], results

    return results, join


@pytest.fixture
def local_child() -> None:
    """The next process runs on the local backend, whatever backend the suite is on.

    What is under test is this process's liveness check, the same on every backend; freezing
    the child with SIGSTOP is what needs a local process (in a container, the signal stops
    the container's init, not the program, which goes on answering).
    """
    mp.set_default_backend("local")


@pytest.fixture
def handles() -> Iterator[tuple[Any, Any, Any, Any]]:
    out = mp.Queue()
    p = mp.Process(target=tasks.hand_out_handles, args=(out,))
    p.start()
    q, sq, conn, _pid = out.get(timeout=60)
    yield q, sq, conn, p
    p.kill()  # a stopped process is killed too
    p.join(30)
    assert p.exitcode is not None


def _assert_gone(results: dict[str, Any]) -> None:
    for name, got in results.items():
        assert isinstance(got, OSError), (name, got)
        assert "gone" in str(got) or "stopped answering" in str(got), (name, got)


def test_waits_on_a_killed_broker_raise(handles: tuple[Any, Any, Any, Any]) -> None:
    q, sq, conn, p = handles
    results, join = _blocked({"get": q.get, "get_timeout": lambda: q.get(timeout=50),
                              "simple_get": sq.get, "recv": conn.recv})
    time.sleep(0.5)  # let them block (not needed for correctness: they raise either way)
    start = time.monotonic()
    p.kill()
    join()
    assert time.monotonic() - start < 20
    if isinstance(conn, HostConnection):  # the stdlib's socket pipe
        assert isinstance(results.pop("recv"), EOFError)
        with pytest.raises(BrokenPipeError):
            conn.send(1)
    _assert_gone(results)
    if not isinstance(conn, HostConnection):
        with pytest.raises(OSError, match="gone"):
            conn.send(1)
    with pytest.raises(OSError, match="gone"):
        q.put(1)


def test_waits_on_a_silent_broker_raise(local_child: None, handles: tuple[Any, Any, Any, Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_timing, "TIMING",
                        dataclasses.replace(_timing.TIMING, heartbeat=0.2, ping=1.0))
    q, sq, conn, p = handles
    p._signal(signal.SIGSTOP)  # its connections stay open; it answers nothing
    start = time.monotonic()
    calls = {"get": q.get, "simple_get": lambda: sq.get(timeout=50), "recv": conn.recv}
    if isinstance(conn, HostConnection):  # a stopped peer of a socket pipe is a slow one
        del calls["recv"]
        assert not conn.poll(0.5)
    results, join = _blocked(calls)
    join()
    assert time.monotonic() - start < 20
    _assert_gone(results)
