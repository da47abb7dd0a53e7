"""An object server's table counts handles by the process holding them (`ObjectTable`), and
its transport says which calling processes are gone (`_rpc.Callers`)."""

from __future__ import annotations

import socket
import threading
import time
import weakref

import pytest

from fiberexec.multiprocessing._rpc import (
    Callers,
    _Conn,
    caller_waits,
    process_token,
    serving,
)
from fiberexec.multiprocessing._sync_server import ObjectTable
from fiberexec.multiprocessing._timing import TIMING


class Held:
    """An object a table keeps (weakly referable, to see it freed)."""


def _table_of(*holders: str) -> tuple[ObjectTable, dict[str, int], dict[str, weakref.ref[Held]]]:
    """A table with one object made by each of ``holders``: ids and weak references by
    maker."""
    table = ObjectTable("broker", "handle")
    ids, refs = {}, {}
    for holder in holders:
        obj = Held()
        ids[holder], refs[holder] = table.add(obj, "Lock", holder), weakref.ref(obj)
    return table, ids, refs


def test_a_holder_gone_frees_only_what_no_other_holder_holds() -> None:
    table, ids, refs = _table_of("parent", "killed")
    kept, shared = ids["parent"], ids["killed"]
    table.incref(kept, "killed")  # the parent's object, copied into the killed process
    table.incref(kept, "killed")
    table.incref(shared, "live")  # the killed one's object, copied into a live one
    table.drop_holder("killed")
    assert table.get(kept)[0] is refs["parent"]() is not None
    assert table.get(shared)[0] is refs["killed"]() is not None
    table.decref([shared], "live")
    assert refs["killed"]() is None  # its last holder released it: freed
    with pytest.raises(ReferenceError, match="freed when the last handle"):
        table.get(shared)
    table.decref([kept], "parent")
    assert refs["parent"]() is None and len(table) == 0


def test_a_holder_gone_frees_what_it_alone_held() -> None:
    table, ids, refs = _table_of("parent")
    table.incref(ids["parent"], "child")
    table.decref([ids["parent"]], "parent")  # the parent dropped its handle first
    table.drop_holder("child")
    assert refs["parent"]() is None and len(table) == 0


def test_a_release_by_a_process_that_holds_no_handle_is_ignored() -> None:
    """A release of a handle the process was never counted for (a copy a forked child
    inherited), or again after it was dropped as gone, takes nothing from the others."""
    table, ids, refs = _table_of("parent")
    oid = ids["parent"]
    table.incref(oid, "child")
    table.decref([oid], "forked")
    table.drop_holder("child")
    table.decref([oid], "child")  # (late: it was dropped as gone)
    assert table.get(oid)[0] is refs["parent"]() is not None
    table.decref([oid], "parent")
    assert refs["parent"]() is None


def test_a_call_of_a_holder_dropped_as_gone_counts_nothing() -> None:
    """Calls of a process still come after its monitor closed (they were under way): they
    change nothing until no connection of it is left and it is forgotten."""
    table, ids, refs = _table_of("parent")
    oid = ids["parent"]
    table.drop_holder("killed")
    table.incref(oid, "killed")
    late = Held()
    table.add(late, "Lock", "killed")
    assert len(table) == 1
    table.decref([oid], "parent")
    assert refs["parent"]() is None  # the late incref held nothing
    table.forget_holder("killed")
    assert not table._gone  # (nothing kept for a process once its last call is in)


class Recorded:
    """`_rpc.Holders` that records what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def drop_holder(self, token: str) -> None:
        self.told.append(("drop", token))

    def forget_holder(self, token: str) -> None:
        self.told.append(("forget", token))


def _callers() -> tuple[Callers, list[tuple[str, str]]]:
    holders = Recorded()
    return Callers(holders), holders.told


def _open(callers: Callers, token: str, *, monitor: bool = False) -> _Conn:
    conn = _Conn()
    callers.came(conn, token, monitor)
    return conn


def test_a_process_is_dropped_when_its_monitor_closes_and_forgotten_after_its_last_call() -> None:
    callers, told = _callers()
    monitor, waiting = _open(callers, "p", monitor=True), _open(callers, "p")
    callers.left(monitor, closing=False)
    assert told == [("drop", "p")]  # a call of it still waits: it is released all the same
    assert not callers.await_gone("p", timeout=0)  # (that call keeps what it waits on)
    callers.left(waiting, closing=False)
    assert told == [("drop", "p"), ("forget", "p")]
    assert callers.await_gone("p", timeout=0)


def test_a_process_with_a_monitor_open_is_not_gone() -> None:
    callers, told = _callers()
    first = _open(callers, "p", monitor=True)
    thread = _open(callers, "p")
    callers.left(thread, closing=False)  # a thread of it ended: the process lives
    successor = _open(callers, "p", monitor=True)  # a lost client replaced (`client_for`)
    callers.left(first, closing=False)
    assert told == []
    assert not callers.await_gone("p", timeout=0)
    callers.left(successor, closing=False)
    assert told == [("drop", "p"), ("forget", "p")]


def test_no_process_is_gone_for_a_connection_the_server_closed_or_without_a_monitor() -> None:
    callers, told = _callers()
    callers.left(_open(callers, "closed", monitor=True), closing=True)  # the server's close
    callers.left(_open(callers, "forked"), closing=False)  # it never sent a monitor
    callers.left(_open(callers, process_token(), monitor=True), closing=False)  # ourselves
    assert told == []


def test_await_gone_returns_once_the_release_is_done() -> None:
    released = threading.Event()

    class Signalling(Recorded):
        def drop_holder(self, token: str) -> None:
            super().drop_holder(token)
            released.set()

    callers = Callers(Signalling())
    monitor = _open(callers, "p", monitor=True)
    closer = threading.Thread(target=callers.left, args=(monitor, False))
    closer.start()
    assert callers.await_gone("p", timeout=60)
    assert released.is_set()
    closer.join(60)


def test_a_wait_for_a_client_ends_once_it_hangs_up() -> None:
    """A server thread waiting on behalf of a client (`caller_waits`, in pieces) stops soon
    after the client hangs up, without a result; a client still there waits it out."""
    never = threading.Event()
    ours, theirs = socket.socketpair()
    try:
        serving.sock = ours
        assert not caller_waits(never.wait, timeout=2 * TIMING.gone_check)  # there: waits it out
        theirs.close()
        started = time.monotonic()
        assert not caller_waits(never.wait, timeout=None)  # gone: ends within a piece
        assert time.monotonic() - started < 60
        assert caller_waits(threading.Event().wait, timeout=0) is False
    finally:
        del serving.sock
        ours.close()
        theirs.close()


def test_outside_a_server_thread_a_wait_is_the_wait_itself() -> None:
    done = threading.Event()
    done.set()
    assert caller_waits(done.wait, timeout=None)
