"""The wire protocol between the executor and its workers.

Every message is ``b"FX" | version:u8 | kind:u8 | body``. Bodies are explicit structs (below),
never pickles, so a frame is checked whole before anything in it is unpickled, and
`decode` on arbitrary bytes raises only `ProtocolError`.

    worker                         executor
      | -- Hello(worker_id, nonce,  -->  |   the channel is fresh; nothing is trusted yet;
      |          proof, shm_probe) ---  |   proof = HMAC(secret, "worker" | both nonces)
      | <-- Setup(proof, shm, claims,   |   proof = HMAC(secret, "executor" | both nonces);
      |           initializer, ...) --  |   from here on both sides are authenticated
      | -- Initialized / InitFailed -->  |   after the initializer, if there is one
      | <-- Tasks(functions, tasks,     |   as many tasks as the worker has credit for;
      |           alone) -------------  |   alone: nothing more comes while they run
      |                                 |   but control messages (the executor's word)
      | -- Results(results) ---------->  |   completions return credit
      | <-> Heartbeat                   |   sent when nothing else is; `Setup.silence` of
      |                                 |   silence means the peer is gone; a worker's
      |                                 |   also goes out every heartbeat while results
      |                                 |   flow, with its CPU and memory use, and with
      |                                 |   the tasks' output lines (before any result
      |                                 |   that follows them)
      | <-- DumpStack(request_id) ----  |   the Python stack of every thread, please
      | -- Stack(request_id, text) --->  |   answered by a thread not running the task
      | <-- Interrupt() --------------  |   Ctrl-C for the running task: KeyboardInterrupt
      | <-- Revoke(task_ids) ---------  |   give back tasks not started yet (for idle workers)
      | -- Revoked(task_ids) --------->  |   the ones it gave back (it runs the others)
      | -- Imported(modules) --------->  |   installed modules its tasks imported (a
      |                                 |   worker on this host: for the launcher)
      | <-- Bye / Bye -->               |   orderly exit (shutdown, max_tasks_per_child)

A payload (pickle stream + out-of-band buffers) travels inline, or, between processes that
share ``/dev/shm``, as the names of shared-memory files holding its large buffers.

The handshake takes one round trip: the executor's nonce for a worker (single use) travels
in the worker's start request (`WorkerSpec.env`), so the worker proves itself in its first
message, and the executor proves itself in its answer, which the worker checks before it
acts on anything in it. A peer without the secret gets no answer: its connection is closed.

Whether the two share ``/dev/shm`` is settled in the same round trip: a worker on the local
link writes its proof into a probe file there (under the executor's prefix, with its claim
board beside it, `fiberexec._claims`) and names it in its Hello; the executor reads it, and
says in the Setup whether large buffers go through shared memory and whether the board is
used. Both unlink the names then; a worker whose handshake fails unlinks them before it
leaves.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from fiberexec import _argcache, _shm
from fiberexec._argcache import Mirror, Store
from fiberexec._errors import ProtocolError, SerializationError
from fiberexec._record import Record
from fiberexec._serialize import Payload

MAGIC = b"FX"
VERSION = 9  # 7: Interrupt; 8: Imported; 9: a handshake of one round trip
NONCE_SIZE = 16
PROOF_SIZE = 32
SHM_THRESHOLD = 1 << 20  # buffers this large go through shared memory when the peer shares it
MAX_MESSAGE = 1 << 31  # the longest message a link carries
BATCH_ROOM = 64 << 20  # a message's other tasks (or results) take less than this beside one
MAX_PAYLOAD = MAX_MESSAGE - BATCH_ROOM  # what one task's arguments or result may put in one
HANDSHAKE_MAX = 4096  # a pre-authentication frame larger than this is rejected unread

_HEADER = struct.Struct("!2sBB")
_U32 = struct.Struct("!I")
_U8 = struct.Struct("!B")
_PAYLOAD = struct.Struct("!II")  # pickle length, number of out-of-band buffers
_BUFFER = struct.Struct("!BQ")  # mode (bits below), size
_SHM = 1  # the buffer is in a shared-memory file, named next (else inline, after the header)
_KEEP = 2  # a key follows: the worker keeps the buffer under it (fiberexec._argcache)
_REF = 4  # only a key follows: the worker holds the buffer already
_TASK = struct.Struct("!QIII")  # task id, function index, then a payload head
_RESULT = struct.Struct("!QBdII")  # task id, status, runtime, then a payload head


class Kind(enum.IntEnum):
    HELLO = 1
    SETUP = 4
    TASKS = 5
    RESULTS = 6
    HEARTBEAT = 7
    BYE = 8
    INIT_FAILED = 9
    INITIALIZED = 10
    REVOKE = 11
    REVOKED = 12
    DUMP_STACK = 13
    STACK = 14
    INTERRUPT = 15
    IMPORTED = 16


class Status(enum.IntEnum):
    OK = 0  # payload is the result
    RAISED = 1  # payload is (exception, remote traceback text)


class Hello(NamedTuple):
    worker_id: str
    nonce: bytes  # the worker's, fresh
    pid: int
    host: str
    proof: bytes  # over the executor's nonce for this worker and the worker's
    shm_probe: str  # a file in /dev/shm holding ``proof``, and its claim board ("": none)


class OutputMode(enum.IntEnum):
    INHERIT = 0  # leave them: they go where the worker's own output goes
    FORWARD = 1  # capture them and send their lines, prefixed "[w12 host] ", with heartbeats
    DISCARD = 2
    FILES = 3  # as FORWARD, unprefixed: the executor writes them to a file per worker


class Setup(NamedTuple):
    proof: bytes  # the executor's, over both nonces: the worker checks it first
    shm: bool  # the executor read the probe: large buffers go through /dev/shm, both ways
    claims: bool  # ...mapped the board and made its semaphore: it takes tasks back there
                  # (`fiberexec._claims`); the worker opens the semaphore
    heartbeat: float
    silence: float  # seconds without a message after which the worker leaves
    max_tasks: int  # 0: unlimited
    initializer: Payload | None
    output: OutputMode = OutputMode.INHERIT  # what the worker does with tasks' stdout, stderr
    arg_cache: int = 0  # bytes of large arguments to keep (fiberexec._argcache); 0: none


class Task(Record):
    __slots__ = ("args", "function", "task_id")

    def __init__(self, task_id: int, function: int, args: Payload) -> None:
        self.task_id = task_id
        self.function = function  # index into Tasks.functions
        self.args = args  # pickled (args, kwargs)


class Tasks(NamedTuple):
    functions: Sequence[Payload]
    tasks: Sequence[Task]
    # The executor sends no task to wait behind these while they run (their length is
    # unknown, or long): the worker need not watch for any soon (see `worker.Watcher`).
    alone: bool = False


class Result(Record):
    __slots__ = ("payload", "runtime", "status", "task_id")

    def __init__(self, task_id: int, status: Status, payload: Payload,
                 runtime: float = 0.0) -> None:
        self.task_id = task_id
        self.status = status
        self.payload = payload
        self.runtime = runtime  # seconds the task ran


class Results(NamedTuple):
    results: Sequence[Result]


class Heartbeat(NamedTuple):
    """I am here; from a worker, with its process's resource use (the executor's: none)."""

    cpu_percent: float = -1.0  # since its last heartbeat (100: one core); negative: unknown
    rss_bytes: int = 0  # resident memory; 0: unknown
    stdout: bytes = b""  # whole lines the tasks wrote since the last heartbeat
    stderr: bytes = b""


def keepalive(heartbeat: float, silence: float) -> float:
    """Seconds between the heartbeats to and from a worker that has no task: ``heartbeat``,
    or a quarter of ``silence`` (`silence_timeout`) if that is longer. Each side judges the
    other's silence only after ``silence``, so four still fall within it, and a thousand
    idle workers and their executor do not wake a thousand times a second to say they are
    there. A worker at work beats every ``heartbeat`` (its CPU and memory use are fresh)."""
    return max(heartbeat, silence / 4)


class Bye(NamedTuple):
    reason: str = ""


class InitFailed(NamedTuple):
    error: Payload


class Initialized(NamedTuple):
    """The worker's initializer returned (a shutdown lets it finish, as the stdlib's does)."""


class Revoke(NamedTuple):
    """Tasks the executor wants back if they have not started (another worker is idle)."""

    task_ids: Sequence[int]


class Revoked(NamedTuple):
    """The tasks given back unstarted: the worker will not run them."""

    task_ids: Sequence[int]


class DumpStack(NamedTuple):
    """Asks a worker for the Python stack of each of its threads."""

    request_id: int


class Stack(NamedTuple):
    """A worker's answer to `DumpStack`: the formatted stacks."""

    request_id: int
    text: str


class Interrupt(NamedTuple):
    """What a terminal's Ctrl-C does to a standard library worker, for the task running
    (none: nothing happens): ``KeyboardInterrupt`` in it (SIGINT, so the task's own handler,
    if it set one, runs instead). Sent when the program's Ctrl-C ends its executor."""


class Imported(NamedTuple):
    """Installed modules a worker's tasks imported (`fiberexec._imports`): the name and
    file of each, for the launcher its later workers are forked from."""

    modules: Sequence[tuple[str, str]]


Message = (Hello | Setup | Tasks | Results | Heartbeat | Bye | InitFailed
           | Initialized | Revoke | Revoked | DumpStack | Stack | Interrupt | Imported)


def check_fits(payload: Payload, shared: bool, what: str) -> int:
    """The bytes ``payload`` puts in a message: all of them, or, where the peer shares this
    host's shared memory, all but its large buffers (those go there). Raises
    `SerializationError` naming ``what`` when that is more than `MAX_PAYLOAD`."""
    nbytes, buffers = len(payload.data), payload.buffers
    if buffers:  # (most payloads have none: this runs for every task and result)
        nbytes += sum(b.nbytes for b in buffers if not shared or b.nbytes < SHM_THRESHOLD)
    if nbytes > MAX_PAYLOAD:
        raise SerializationError(
            f"{what} pickle to {_size(nbytes)}, more than the {_size(MAX_PAYLOAD)} one "
            "message may carry between an executor and a worker that do not share shared "
            "memory (another host, a container without the host's /dev/shm); send the data "
            "in pieces, or put it where the other side can read it (a file, an object store) "
            "and send its name")
    return nbytes


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes} bytes"


class ShmPolicy:
    """How to move large buffers: through shared memory (``executor_id`` set) or inline."""

    __slots__ = ("created", "executor_id", "threshold")

    def __init__(self, executor_id: str | None = None, threshold: int = SHM_THRESHOLD) -> None:
        self.executor_id = executor_id
        self.threshold = threshold
        self.created: list[str] = []  # names written by the last encode


# ---------------------------------------------------------------------------- encoding


class _Writer:
    def __init__(self, kind: Kind, shm: ShmPolicy | None, cache: Mirror | None) -> None:
        self.parts: list[bytes | memoryview] = [_HEADER.pack(MAGIC, VERSION, kind)]
        self.shm = shm
        self.cache = cache
        self.keys: dict[tuple[int, int], bytes] = {}  # this frame's digests, by buffer owner

    def pack(self, fmt: str, *values: object) -> None:
        self.parts.append(struct.pack(fmt, *values))

    def blob(self, data: bytes | memoryview) -> None:
        self.pack("!I", len(data))
        self.parts.append(data)

    def text(self, value: str) -> None:
        data = value.encode()
        self.pack("!H", len(data))
        self.parts.append(data)

    def payload(self, payload: Payload) -> None:
        self.parts.append(_PAYLOAD.pack(len(payload.data), len(payload.buffers)))
        self.payload_body(payload)

    def payload_body(self, payload: Payload) -> None:
        self.parts.append(payload.data)
        for buffer in payload.buffers:
            self._buffer(buffer.cast("B") if buffer.format != "B" or buffer.ndim != 1 else buffer)

    def _buffer(self, view: memoryview) -> None:
        cache, key = self.cache, b""
        if cache is not None and cache.cacheable(view.nbytes):
            key = self._key(view)
            if cache.note(key, view.nbytes):  # the worker holds it: send the key alone
                self.pack("!BQ", _REF, view.nbytes)
                self.parts.append(key)
                return
        keep = _KEEP if key else 0
        shm = self.shm
        if shm is not None and shm.executor_id is not None and view.nbytes >= shm.threshold:
            name = _shm.write(shm.executor_id, view, keep=bool(keep))
            if name is not None:  # (None: no room there; it goes inline)
                shm.created.append(name)
                self.pack("!BQ", _SHM | keep, view.nbytes)
                self.parts.append(key)
                self.text(name)
                return
        self.pack("!BQ", keep, view.nbytes)
        self.parts.append(key)
        self.parts.append(view)

    def _key(self, view: memoryview) -> bytes:
        # One digest per buffer owner per frame: a map's tasks share one parameter vector.
        owner = (id(view.obj), view.nbytes)
        key = self.keys.get(owner)
        if key is None:
            key = self.keys[owner] = _argcache.digest(view)
        return key

    def frame(self) -> bytes:
        return b"".join(self.parts)


def encode(message: Message, shm: ShmPolicy | None = None, cache: Mirror | None = None) -> bytes:
    """Encode ``message`` into one frame; ``cache`` mirrors what the receiving worker keeps
    of large arguments (see `fiberexec._argcache`)."""
    kind, write = _ENCODERS[type(message)]
    writer = _Writer(kind, shm, cache)
    write(writer, message)
    return writer.frame()


def _enc_hello(w: _Writer, m: Hello) -> None:
    w.text(m.worker_id)
    w.parts.append(_fixed(m.nonce, NONCE_SIZE, "nonce"))
    w.pack("!I", m.pid)
    w.text(m.host)
    w.parts.append(_fixed(m.proof, PROOF_SIZE, "proof"))
    w.text(m.shm_probe)


def _enc_setup(w: _Writer, m: Setup) -> None:
    w.parts.append(_fixed(m.proof, PROOF_SIZE, "proof"))
    w.pack("!BB", m.shm, m.claims)
    w.pack("!ddIQBB", m.heartbeat, m.silence, m.max_tasks, m.arg_cache,
           m.initializer is not None, m.output)
    if m.initializer is not None:
        w.payload(m.initializer)


def _enc_tasks(w: _Writer, m: Tasks) -> None:
    w.pack("!B", m.alone)
    w.pack("!I", len(m.functions))
    for fn in m.functions:
        w.payload(fn)
    w.pack("!I", len(m.tasks))
    parts, head, cache = w.parts, _TASK.pack, w.cache
    for task in m.tasks:
        if cache is not None:
            cache.next_task()
        args = task.args
        parts.append(head(task.task_id, task.function, len(args.data), len(args.buffers)))
        if args.buffers:
            w.payload_body(args)
        else:
            parts.append(args.data)


def _enc_results(w: _Writer, m: Results) -> None:
    w.pack("!I", len(m.results))
    parts, head = w.parts, _RESULT.pack
    for r in m.results:
        data = r.payload
        parts.append(head(r.task_id, r.status, r.runtime, len(data.data), len(data.buffers)))
        if data.buffers:
            w.payload_body(data)
        else:
            parts.append(data.data)


def _enc_empty(w: _Writer, m: object) -> None:
    pass


def _enc_heartbeat(w: _Writer, m: Heartbeat) -> None:
    w.pack("!dQ", m.cpu_percent, m.rss_bytes)
    w.blob(m.stdout)
    w.blob(m.stderr)


def _enc_dump_stack(w: _Writer, m: DumpStack) -> None:
    w.pack("!Q", m.request_id)


def _enc_stack(w: _Writer, m: Stack) -> None:
    w.pack("!Q", m.request_id)
    w.blob(m.text.encode("utf-8", "replace"))


def _enc_ids(w: _Writer, m: Revoke | Revoked) -> None:
    w.pack("!I", len(m.task_ids))
    w.parts.append(struct.pack(f"!{len(m.task_ids)}Q", *m.task_ids))


def _enc_imported(w: _Writer, m: Imported) -> None:
    w.pack("!I", len(m.modules))
    for name, origin in m.modules:
        w.text(name)
        w.text(origin)


def _enc_bye(w: _Writer, m: Bye) -> None:
    w.text(m.reason)


def _enc_init_failed(w: _Writer, m: InitFailed) -> None:
    w.payload(m.error)


def _fixed(value: bytes, size: int, what: str) -> bytes:
    if len(value) != size:
        raise ProtocolError(f"{what} must be {size} bytes, got {len(value)}")
    return value


_ENCODERS: dict[type, tuple[Kind, Callable[[_Writer, object], None]]] = {
    Hello: (Kind.HELLO, _enc_hello),  # type: ignore[dict-item]
    Setup: (Kind.SETUP, _enc_setup),  # type: ignore[dict-item]
    Tasks: (Kind.TASKS, _enc_tasks),  # type: ignore[dict-item]
    Results: (Kind.RESULTS, _enc_results),  # type: ignore[dict-item]
    Heartbeat: (Kind.HEARTBEAT, _enc_heartbeat),  # type: ignore[dict-item]
    Bye: (Kind.BYE, _enc_bye),  # type: ignore[dict-item]
    InitFailed: (Kind.INIT_FAILED, _enc_init_failed),  # type: ignore[dict-item]
    Initialized: (Kind.INITIALIZED, _enc_empty),
    Revoke: (Kind.REVOKE, _enc_ids),  # type: ignore[dict-item]
    Revoked: (Kind.REVOKED, _enc_ids),  # type: ignore[dict-item]
    DumpStack: (Kind.DUMP_STACK, _enc_dump_stack),  # type: ignore[dict-item]
    Stack: (Kind.STACK, _enc_stack),  # type: ignore[dict-item]
    Interrupt: (Kind.INTERRUPT, _enc_empty),
    Imported: (Kind.IMPORTED, _enc_imported),  # type: ignore[dict-item]
}

# ---------------------------------------------------------------------------- decoding


class _Reader:
    def __init__(self, data: bytes, allow_shm: bool, store: Store | None) -> None:
        self.view = memoryview(data)
        self.pos = 0
        self.allow_shm = allow_shm
        self.store = store

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise ProtocolError(f"truncated frame: wanted {n} bytes at offset {self.pos}")
        chunk = self.view[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str) -> tuple[int | float, ...]:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))

    def uint(self, fmt: str) -> int:
        (value,) = self.unpack(fmt)
        return int(value)

    def count(self, minimum_each: int) -> int:
        n: int = self.unpack_struct(_U32)[0]
        if n * minimum_each > len(self.view) - self.pos:
            raise ProtocolError(f"frame claims {n} items but is too short to hold them")
        return n

    def blob(self) -> bytes:
        return bytes(self.take(self.uint("!I")))

    def text(self) -> str:
        try:
            return str(self.take(self.uint("!H")), "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError("text field is not UTF-8") from exc

    def payload(self) -> Payload:
        size, nbuffers = self.unpack_struct(_PAYLOAD)
        return self.payload_body(size, nbuffers)

    def payload_body(self, size: int, nbuffers: int) -> Payload:
        start, end = self.pos, self.pos + size
        if end > len(self.view):  # (a negative size cannot be: it is unpacked unsigned)
            raise ProtocolError(f"truncated frame: wanted {size} bytes at offset {start}")
        self.pos = end
        data = self.view[start:end].tobytes()
        if not nbuffers:
            return Payload(data)
        return Payload(data, [self._buffer() for _ in range(nbuffers)])

    def unpack_struct(self, st: struct.Struct) -> tuple[Any, ...]:
        end = self.pos + st.size
        if end > len(self.view):
            raise ProtocolError(f"truncated frame: wanted {st.size} bytes at offset {self.pos}")
        values = st.unpack_from(self.view, self.pos)
        self.pos = end
        return values

    def _buffer(self) -> memoryview:
        mode, size = self.unpack_struct(_BUFFER)
        if mode & (_KEEP | _REF):
            return self._cached(mode, int(size))
        return self._plain(mode, int(size))

    def _plain(self, mode: int, size: int) -> memoryview:
        if mode == 0:
            return memoryview(bytearray(self.take(size)))
        if mode == _SHM and self.allow_shm:
            name = self.text()
            try:
                return _shm.take(name, size)
            except (OSError, ValueError) as exc:
                raise ProtocolError(f"shared-memory buffer {name!r} unavailable: {exc}") from exc
        raise ProtocolError(f"unknown buffer mode {mode}")

    def _cached(self, mode: int, size: int) -> memoryview:
        store = self.store
        if store is None:
            raise ProtocolError("a cached argument was sent to a peer that keeps none")
        key = bytes(self.take(_argcache.KEY_SIZE))
        if mode == _REF:
            copy = store.take(key)
            if copy is None or copy.nbytes != size:
                raise ProtocolError(f"a cached argument ({key.hex()[:12]}) is not held here")
            return copy
        return store.keep(key, self._plain(mode & ~_KEEP, size))

    def end(self) -> None:
        if self.pos != len(self.view):
            raise ProtocolError(f"{len(self.view) - self.pos} stray bytes after the message")


def peek_kind(frame: bytes) -> Kind:
    """The kind of a frame, checking only its header."""
    if len(frame) < _HEADER.size:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than the header")
    magic, version, kind = _HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}: not a fiberexec frame")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version} is not {VERSION}; upgrade both sides")
    found = _KINDS.get(kind)
    if found is None:
        raise ProtocolError(f"unknown message kind {kind}")
    return found


def decode(frame: bytes, *, allow_shm: bool = False, store: Store | None = None) -> Message:
    """Decode one frame; raise `ProtocolError` for anything malformed. ``store`` keeps the
    large arguments the executor marks to keep (see `fiberexec._argcache`)."""
    kind = peek_kind(frame)
    reader = _Reader(frame, allow_shm, store)
    reader.take(_HEADER.size)
    try:
        message = _DECODERS[kind](reader)
    except struct.error as exc:
        raise ProtocolError(f"malformed {kind.name} frame: {exc}") from exc
    reader.end()
    return message


def _dec_hello(r: _Reader) -> Hello:
    return Hello(r.text(), bytes(r.take(NONCE_SIZE)), r.uint("!I"), r.text(),
                 bytes(r.take(PROOF_SIZE)), r.text())


def _dec_setup(r: _Reader) -> Setup:
    proof = bytes(r.take(PROOF_SIZE))
    shm, claims = r.unpack("!BB")
    if shm not in (0, 1) or claims not in (0, 1):
        raise ProtocolError(f"bad shared-memory flags {shm}, {claims}")
    heartbeat, silence, max_tasks, arg_cache, has_init, output = r.unpack("!ddIQBB")
    if has_init not in (0, 1):
        raise ProtocolError(f"bad initializer flag {has_init}")
    if output not in _OUTPUT_MODES:
        raise ProtocolError(f"unknown output mode {output}")
    return Setup(proof, bool(shm), bool(claims), float(heartbeat), float(silence), int(max_tasks),
                 r.payload() if has_init else None, _OUTPUT_MODES[int(output)],
                 int(arg_cache))


def _dec_tasks(r: _Reader) -> Tasks:
    (alone,) = r.unpack_struct(_U8)
    if alone > 1:
        raise ProtocolError(f"a Tasks message's flag is {alone}, not 0 or 1")
    functions = [r.payload() for _ in range(r.count(_PAYLOAD.size))]
    known = len(functions)
    tasks = []
    store = r.store
    head = _TASK.unpack_from
    for _ in range(r.count(_TASK.size)):
        if store is not None:
            store.next_task()
        task_id, function, size, nbuffers = head(r.view, r.pos)
        r.pos += _TASK.size
        if function >= known:
            raise ProtocolError(f"task refers to function {function} of {known}")
        tasks.append(Task(task_id, function, r.payload_body(size, nbuffers)))
    return Tasks(functions, tasks, bool(alone))


def _dec_results(r: _Reader) -> Results:
    results = []
    statuses = _STATUSES
    head = _RESULT.unpack_from
    for _ in range(r.count(_RESULT.size)):
        task_id, status, runtime, size, nbuffers = head(r.view, r.pos)
        r.pos += _RESULT.size
        kind = statuses.get(status)
        if kind is None:
            raise ProtocolError(f"unknown result status {status}")
        results.append(Result(task_id, kind, r.payload_body(size, nbuffers), runtime))
    return Results(results)


def _dec_heartbeat(r: _Reader) -> Heartbeat:
    cpu, rss = r.unpack("!dQ")
    return Heartbeat(float(cpu), int(rss), r.blob(), r.blob())


def _dec_stack(r: _Reader) -> Stack:
    request_id = r.uint("!Q")
    return Stack(request_id, r.blob().decode("utf-8", "replace"))


def _dec_imported(r: _Reader) -> Imported:
    return Imported([(r.text(), r.text()) for _ in range(r.count(4))])


def _dec_ids(r: _Reader) -> list[int]:
    n = r.count(8)
    return list(struct.unpack(f"!{n}Q", r.take(8 * n)))


_STATUSES = {int(s): s for s in Status}
_KINDS = {int(k): k for k in Kind}
_OUTPUT_MODES = {int(m): m for m in OutputMode}


_DECODERS: dict[Kind, Callable[[_Reader], Message]] = {
    Kind.HELLO: _dec_hello,
    Kind.SETUP: _dec_setup,
    Kind.TASKS: _dec_tasks,
    Kind.RESULTS: _dec_results,
    Kind.HEARTBEAT: _dec_heartbeat,
    Kind.BYE: lambda r: Bye(r.text()),
    Kind.INIT_FAILED: lambda r: InitFailed(r.payload()),
    Kind.INITIALIZED: lambda r: Initialized(),
    Kind.REVOKE: lambda r: Revoke(_dec_ids(r)),
    Kind.REVOKED: lambda r: Revoked(_dec_ids(r)),
    Kind.DUMP_STACK: lambda r: DumpStack(r.uint("!Q")),
    Kind.STACK: _dec_stack,
    Kind.INTERRUPT: lambda r: Interrupt(),
    Kind.IMPORTED: _dec_imported,
}
