"""The calls a process makes on a broker or a manager's server (`_rpc`), typed.

Each call is a frozen record (`fiberexec._record`); a request's head is the call and its
caller, pickled, and bytes pickled on their own (an item, a method's arguments, a
barrier's action) travel beside it as its body. The answer, ``(result, body)`` or the
exception raised, comes back on the same connection. Each server applies what it receives
under one ``match`` (`_broker.Broker.handle`, `_managers._Server.handle`): a call a role
does not serve is answered with an error that names it.

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

from typing import Any

from fiberexec._record import record_with_dict


@record_with_dict
class Call:
    """What every call is (without slots: a slotted record pickles through a Python-level
    ``__reduce__``, one with an instance dict in C)."""


@record_with_dict
class Ping(Call):
    """Answered by the transport, never by a role."""


@record_with_dict
class Monitor(Call):
    """Answered by the transport: the connection it comes on is the caller's first, open
    until its process ends, so the server learns when the process is gone."""


# ------------------------------------------------------------------- queues and pipes


@record_with_dict
class NewChan(Call):
    maxsize: int
    writers: int


@record_with_dict
class Put(Call):
    cid: int
    wait: float


@record_with_dict
class Get(Call):
    cid: int
    wait: float


@record_with_dict
class Poll(Call):
    cid: int
    wait: float


@record_with_dict
class QSize(Call):
    cid: int


@record_with_dict
class TaskDone(Call):
    cid: int
    marked: int = 0  # marks the caller's process sent on its stream before (`Done`)


@record_with_dict
class Join(Call):
    cid: int
    wait: float


@record_with_dict
class Ref(Call):
    cid: int
    ticket: str


@record_with_dict
class Claim(Call):
    cid: int
    ticket: str


@record_with_dict
class Unref(Call):
    cid: int


@record_with_dict
class Route(Call):
    cid: int


@record_with_dict
class OpenStream(Call):
    """The address of the broker's stream listener (see `_stream`), started now."""


@record_with_dict
class Fetch(Call):
    proc_id: int
    os_pid: int


# ----------------------------------------------------------------- held objects


@record_with_dict
class Output(Call):
    """Lines a child wrote: the body's first ``stdout`` bytes to stdout, the rest to
    stderr."""

    stdout: int


@record_with_dict
class NewObject(Call):
    kind: str
    args: tuple[Any, ...]


@record_with_dict
class CallObject(Call):
    oid: int
    name: str
    args: tuple[Any, ...]


@record_with_dict
class ObjectAttr(Call):
    oid: int
    name: str


@record_with_dict
class Incref(Call):
    oid: int


@record_with_dict
class Decref(Call):
    oids: tuple[int, ...]


@record_with_dict
class ReadBuffer(Call):
    name: str
    offset: int
    size: int


@record_with_dict
class WriteBuffer(Call):
    name: str
    offset: int


# ------------------------------------------------------------ a manager's server


@record_with_dict
class Create(Call):
    typeid: str


@record_with_dict
class CallMethod(Call):
    oid: int
    name: str


@record_with_dict
class GetAttr(Call):
    oid: int
    name: str


@record_with_dict
class SetAttr(Call):
    oid: int
    name: str


@record_with_dict
class DelAttr(Call):
    oid: int
    name: str


@record_with_dict
class Count(Call):
    """How many objects the server holds."""


@record_with_dict
class DebugInfo(Call):
    """Each object the server holds, with its count of handles."""


@record_with_dict
class Shutdown(Call):
    """Stop the server."""
