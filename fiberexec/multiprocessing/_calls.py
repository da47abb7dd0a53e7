"""The calls a process makes on a broker or a manager's server (`_rpc`), typed.

Each call is a frozen dataclass; a request's head is the call and its caller, pickled, and
bytes pickled on their own (an item, a method's arguments, a barrier's action) travel
beside it as its body. The answer, ``(result, body)`` or the exception raised, comes back
on the same connection. Each server applies what it receives under one ``match``
(`_broker.Broker.handle`, `_managers._Server.handle`): a call a role does not serve is
answered with an error that names it.

    to the transport itself   Ping (is the server alive), Monitor (this connection lasts as
                              long as the calling process: see `_rpc`)
    queues and pipes          NewChan (a queue: ``writers`` -1; a pipe direction: its
                              writing ends), Put (the body; waiting up to ``wait`` s
                              for room), Get, Poll (an item or end-of-file within
                              ``wait`` s), QSize, TaskDone, Join
    pipe ends pickled         Ref (hold a count for a copy with ``ticket``), Claim (the
                              caller unpickled it), Unref (the caller closed a copy)
    streams and processes     Route (where a writer may send directly, `_route`),
                              OpenStream (the stream listener, `_stream`), Fetch (a
                              child's process object; the broker learns its pid),
                              Output (a child's stdout and stderr lines, in the body:
                              `_forward`)
    a broker's objects        NewObject (a `_sync_server.KINDS` object; a barrier's
                              action in the body), CallObject,
                              ObjectAttr, Incref, Decref, ReadBuffer, WriteBuffer (a
                              shared value's bytes)
    a manager's server        Create (the body's ``(args, kwds)``), CallMethod (the
                              same), GetAttr, SetAttr (the body's value), DelAttr,
                              Incref, Decref, Count, DebugInfo, Shutdown
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """What every call is (without slots: a slotted frozen dataclass pickles its state
    through Python-level methods, a plain one in C)."""


@dataclass(frozen=True)
class Ping(Call):
    """Answered by the transport, never by a role."""


@dataclass(frozen=True)
class Monitor(Call):
    """Answered by the transport: the connection it comes on is the caller's first, open
    until its process ends, so the server learns when the process is gone."""


# ------------------------------------------------------------------- queues and pipes


@dataclass(frozen=True)
class NewChan(Call):
    maxsize: int
    writers: int


@dataclass(frozen=True)
class Put(Call):
    cid: int
    wait: float


@dataclass(frozen=True)
class Get(Call):
    cid: int
    wait: float


@dataclass(frozen=True)
class Poll(Call):
    cid: int
    wait: float


@dataclass(frozen=True)
class QSize(Call):
    cid: int


@dataclass(frozen=True)
class TaskDone(Call):
    cid: int


@dataclass(frozen=True)
class Join(Call):
    cid: int
    wait: float


@dataclass(frozen=True)
class Ref(Call):
    cid: int
    ticket: str


@dataclass(frozen=True)
class Claim(Call):
    cid: int
    ticket: str


@dataclass(frozen=True)
class Unref(Call):
    cid: int


@dataclass(frozen=True)
class Route(Call):
    cid: int


@dataclass(frozen=True)
class OpenStream(Call):
    """The address of the broker's stream listener (see `_stream`), started now."""


@dataclass(frozen=True)
class Fetch(Call):
    proc_id: int
    os_pid: int


# ----------------------------------------------------------------- held objects


@dataclass(frozen=True)
class Output(Call):
    """Lines a child wrote: the body's first ``stdout`` bytes to stdout, the rest to
    stderr."""

    stdout: int


@dataclass(frozen=True)
class NewObject(Call):
    kind: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class CallObject(Call):
    oid: int
    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class ObjectAttr(Call):
    oid: int
    name: str


@dataclass(frozen=True)
class Incref(Call):
    oid: int


@dataclass(frozen=True)
class Decref(Call):
    oids: tuple[int, ...]


@dataclass(frozen=True)
class ReadBuffer(Call):
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class WriteBuffer(Call):
    name: str
    offset: int


# ------------------------------------------------------------ a manager's server


@dataclass(frozen=True)
class Create(Call):
    typeid: str


@dataclass(frozen=True)
class CallMethod(Call):
    oid: int
    name: str


@dataclass(frozen=True)
class GetAttr(Call):
    oid: int
    name: str


@dataclass(frozen=True)
class SetAttr(Call):
    oid: int
    name: str


@dataclass(frozen=True)
class DelAttr(Call):
    oid: int
    name: str


@dataclass(frozen=True)
class Count(Call):
    """How many objects the server holds."""


@dataclass(frozen=True)
class DebugInfo(Call):
    """Each object the server holds, with its count of handles."""


@dataclass(frozen=True)
class Shutdown(Call):
    """Stop the server."""
