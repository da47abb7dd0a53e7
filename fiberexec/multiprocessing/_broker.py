"""The broker: this process's queues, pipe channels and process payloads, served over `_rpc`.

Every `Queue`, `Pipe` and `Process` created here lives in one broker per process, started on
first use. Its queues and pipes are `_channels.Channels`: calls reach them here (`handle`),
streams through `_hub`. Items are stored as the bytes their sender pickled; the broker never
unpickles them. A blocking call waits for at most the time the request asks (clients wait
longer in slices, so a vanished client holds a server thread for one slice).

Trust model: the broker's secret reaches only processes we start (through
`WorkerSpec.secret_env`) and pickled handles sent to our own workers over the executor's
authenticated channel. Whoever holds a handle's pickle holds the secret: do not store one.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from fiberexec import _auth
from fiberexec._serialize import loads_bytes
from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing import _forward, _sync_server, _timing
from fiberexec.multiprocessing._channels import Channels
from fiberexec.multiprocessing._hub import Hub
from fiberexec.multiprocessing._rpc import Caller, Endpoint, RpcServer

log = logging.getLogger("fiberexec.multiprocessing")

SHARED_HEADER = 16  # bytes before a shared value's data (see `_sharedctypes`)


class Broker:
    def __init__(self, host: str, advertise: str) -> None:
        self.secret = _auth.new_secret()
        self.channels = Channels()  # its queues and pipes
        self.processes: dict[int, bytes] = {}
        self.pids: dict[int, int] = {}
        self.tokens: dict[int, str] = {}  # child -> its process token (from its fetch)
        self.fetched = threading.Condition()  # notified when a child reports its pid
        # locks, events, ... (see `_sync_server`), freed with their last handle (`_sync`)
        self.objects = _sync_server.ObjectTable("process that created it", "handle")
        self.hub: Hub | None = None  # the hub (started when a remote process asks)
        self.buffers: dict[str, weakref.ref[mmap.mmap]] = {}  # shared values' memory, by
        # name (`_sharedctypes`), for processes that cannot map it
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        # a process that called here and is gone (killed) releases what it held
        self.server = RpcServer(self.secret, self.handle, host, holders=self.objects)
        self.advertise = advertise
        self.address = self.server.advertised(advertise)
        self.endpoint = Endpoint(self.address, self.secret)
        _alias(self.server, self.address)

    def handle(  # noqa: PLR0912 (a case a kind)
            self, call: calls.Call, body: bytes, caller: Caller) -> tuple[Any, bytes]:
        """Serve one call (`_rpc`): its result and the answer's body."""
        _sync_server.caller.value = caller
        result: Any = None
        channels = self.channels
        match call:
            case calls.Get(cid, wait):
                return channels.get(cid, wait)
            case calls.Put(cid, wait):
                result = channels.put(body, cid, wait)
            case calls.Poll(cid, wait):
                result = channels.poll(cid, wait)
            case calls.CallObject(oid, name, args):
                result = getattr(self.obj(oid), name)(*args)
            case calls.NewChan(maxsize, writers):
                result = channels.new(maxsize, writers)
            case calls.QSize(cid):
                result = channels.qsize(cid)
            case calls.TaskDone(cid, marked):
                channels.task_done(cid, caller[0], marked)
            case calls.Join(cid, wait):
                result = channels.join(cid, wait)
            case calls.Ref(cid, ticket):
                result = channels.ref(cid, ticket)
            case calls.Claim(cid, ticket):
                channels.claim(cid, ticket, caller[0])
            case calls.Unref(cid):
                channels.unref(cid, caller[0])
            case calls.Route(cid):
                result = channels.route(cid, caller[0])
            case calls.OpenStream():
                result = self._stream()
            case calls.Fetch(proc_id, os_pid):
                return None, self._fetch(proc_id, os_pid, caller[0])
            case calls.Output(stdout):
                _forward.write(body[:stdout], body[stdout:])
            case calls.NewObject(kind, args):
                result = self._obj_new(body, kind, args, caller[0])
            case calls.ObjectAttr(oid, name):
                result = getattr(self.obj(oid), name)
            case calls.Incref(oid):
                self.objects.incref(oid, caller[0])
            case calls.Decref(oids):
                self.objects.decref(oids, caller[0])
            case calls.ReadBuffer(name, offset, size):
                return None, bytes(self.buffer(name)[offset:offset + size])
            case calls.WriteBuffer(name, offset):
                self.buffer(name)[offset:offset + len(body)] = body
            case _:
                raise ValueError(f"a broker does not serve {call!r}")
        return result, b""

    def _obj_new(self, body: bytes, kind: str, args: tuple[Any, ...], holder: str) -> int:
        kwargs: dict[str, Any] = {}
        if body:
            kwargs["action"] = loads_bytes(body, what="barrier action")
        return self.objects.add(_sync_server.KINDS[kind](*args, **kwargs), kind, holder)

    def obj(self, oid: int) -> Any:
        return self.objects.get(oid)[0]

    def buffer(self, name: str) -> memoryview:
        found = self.buffers.get(name)
        view = found() if found is not None else None
        if view is None:
            raise ValueError(f"shared buffer {name} is gone (its creator released it)")
        return memoryview(view)[SHARED_HEADER:]

    def _stream(self) -> tuple[str, int, str]:
        """The address of this broker's stream listener (see `_stream`), started now."""
        with self.lock:
            if self.hub is None:
                self.hub = Hub(self.channels, self.secret, self.server.port, self.advertise)
        return self.hub.address

    def add_process(self, payload: bytes) -> int:
        with self.lock:
            pid = next(self.ids)
            self.processes[pid] = payload
        return pid

    def _fetch(self, proc_id: int, os_pid: int, token: str) -> bytes:
        with self.lock:
            payload = self.processes.pop(proc_id, None)
            if payload is not None:
                self.tokens[proc_id] = token
        with self.fetched:
            self.pids[proc_id] = os_pid
            self.fetched.notify_all()
        if payload is None:
            raise ValueError(f"process {proc_id} was already fetched or never existed")
        return payload

    def child_ended(self, proc_id: int) -> None:
        """Child ``proc_id`` is seen ended: return once what it held here is released (the
        ends of its connections read, see `_rpc.Callers`), so that after a join() its
        parent's locks it held are freed with the parent's last handle, as the standard
        library's are; at most `Timing.gone` (a vanished host closes no connection)."""
        with self.lock:
            token = self.tokens.pop(proc_id, None)
        if token is not None and not self.server.callers.await_gone(token, _timing.TIMING.gone):
            log.debug("process %d ended, and its connections to this broker are still "
                      "open after %.0f s", proc_id, _timing.TIMING.gone)

    def pid_of(self, proc_id: int, timeout: float, gone: Callable[[], bool]) -> int | None:
        """The pid child ``proc_id`` reported, waiting up to ``timeout`` (unless ``gone()``)."""
        with self.fetched:
            self.fetched.wait_for(lambda: proc_id in self.pids or gone(), timeout)
            return self.pids.get(proc_id)

    def close(self) -> None:
        # what puts left to the feeder goes first
        if not self.channels.feeder.drain(_timing.TIMING.feed):
            log.warning("queue items put just before this process exits were not all sent "
                        "within %.0f s: a consumer stopped reading them", _timing.TIMING.feed)
        if self.hub is not None:
            self.hub.close()
        self.server.close()


def _alias(server: RpcServer, address: str) -> None:
    from fiberexec.multiprocessing import _rpc

    _rpc._local_servers[address] = server


_broker: Broker | None = None
_broker_lock = threading.Lock()


_closed: list[Broker] = []  # closed at exit, before a later exit handler made another


def local_broker(endpoint: Endpoint) -> Broker | None:
    """This process's broker if ``endpoint`` is it (its objects are then called directly)."""
    for broker in (_broker, *_closed):
        if broker is not None and broker.address == endpoint.address and (
                broker.secret == endpoint.secret):
            return broker
    return None


def get_broker() -> Broker:
    """This process's broker, started on first use on the default backend's hosts."""
    global _broker
    with _broker_lock:
        if _broker is None or _broker.server.port == 0:
            from fiberexec.multiprocessing._backends import broker_hosts

            _broker = Broker(*broker_hosts())
            atexit.register(_close_at_exit, _broker, os.getpid())
        return _broker


def _close_at_exit(broker: Broker, pid: int) -> None:
    """(atexit) Close it; a use after this one (an exit handler registered before this
    one, which runs after it) gets a new broker, not one that no longer answers."""
    global _broker
    if os.getpid() == pid:
        with _broker_lock:
            if _broker is broker:
                _broker = None
                _closed.append(broker)  # what it made is still its own, called directly
        broker.close()

