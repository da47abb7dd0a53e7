"""The worker program every backend launches: ``python -m fiberexec.worker``.

It dials the executor named in ``FIBEREXEC_ADDRESS``, authenticates with ``FIBEREXEC_SECRET``,
runs tasks in the order they arrive, and sends results back in batches. It exits when the
executor says goodbye, when the connection drops, or when the executor falls silent for three
heartbeats, so a worker never outlives its executor.

The main thread receives and runs tasks; tasks sent ahead (prefetch) wait in nng's receive
queue, so no thread hop sits between a task's arrival and its start. A small thread sends
heartbeats while a long task runs. The connection's removal ends the process at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NoReturn, TypeVar

from fiberexec import _auth, _contract, _shm
from fiberexec import _protocol as p
from fiberexec._channel import Channel
from fiberexec._errors import ProtocolError, SerializationError
from fiberexec._serialize import Payload, dumps, dumps_exception, loads
from fiberexec._tls import ENV_TLS_CERT, ENV_TLS_SERVER_NAME, client_config

EXIT_AUTH_FAILED = 3
EXIT_NO_EXECUTOR = 4
EXIT_INIT_FAILED = 5
MAX_MESSAGE = 1 << 31
FLUSH_COUNT = 512
FLUSH_BYTES = 8 << 20
FLUSH_AGE = 0.002  # seconds a finished result may wait for others to share its message
SLOW_TASK = 0.0005  # a task this slow sends its result at once: batching would only delay it
M = TypeVar("M")


class _Config:
    def __init__(self, environ: dict[str, str]) -> None:
        self.address = environ[_contract.ENV_ADDRESS]
        self.worker_id = environ.get(_contract.ENV_WORKER_ID, f"w{os.getpid()}")
        self.executor_id = environ.get(_contract.ENV_EXECUTOR_ID, "")
        self.secret = _auth.secret_from_hex(environ[_contract.ENV_SECRET])
        self.connect_timeout = float(environ.get(_contract.ENV_CONNECT_TIMEOUT, "60"))
        self.tls_cert = environ.get(ENV_TLS_CERT)
        self.tls_server_name = environ.get(ENV_TLS_SERVER_NAME, "")


class Worker:
    """One worker's state: the task queue it prefetches into and the results it owes."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        tls = None
        if config.tls_cert:
            tls = client_config(config.tls_cert, config.tls_server_name)
        self.channel = Channel.dial(
            config.address, max_message=MAX_MESSAGE, on_remove=self._on_disconnect, tls=tls
        )
        self.shm = p.ShmPolicy()
        self.allow_shm = False
        self.heartbeat = 1.0
        self.max_tasks = 0
        self.tasks: deque[tuple[p.Task, _Functions]] = deque()
        self.stopping = False
        self.last_heard = time.monotonic()
        self.last_sent = time.monotonic()
        self.send_lock = threading.Lock()

    # ---------------------------------------------------------------- handshake

    def handshake(self) -> p.Setup:
        cfg = self.config
        nonce = _auth.new_nonce()
        hello = p.Hello(cfg.worker_id, nonce, os.getpid(), socket.gethostname())
        self.channel.send(p.encode(hello), cfg.connect_timeout)
        challenge = self._expect(p.Challenge, cfg.connect_timeout)
        expected = _auth.proof(cfg.secret, "executor", nonce, challenge.nonce)
        if not _auth.verify(expected, challenge.proof):
            _die(EXIT_AUTH_FAILED, "the executor failed authentication (wrong secret?)")
        token = b""
        if challenge.shm_probe:
            token = _shm.check_probe(challenge.shm_probe, 64) or b""
        proof = _auth.proof(cfg.secret, "worker", nonce, challenge.nonce)
        self.channel.send(p.encode(p.Auth(proof, token)), cfg.connect_timeout)
        setup = self._expect(p.Setup, cfg.connect_timeout)
        self.allow_shm = bool(token)
        if self.allow_shm:
            self.shm = p.ShmPolicy(executor_id=cfg.executor_id or None)
        self.heartbeat, self.max_tasks = setup.heartbeat, setup.max_tasks
        return setup

    def _expect(self, kind: type[M], timeout: float) -> M:
        msg = self.channel.recv(timeout)
        if msg is None:
            _die(EXIT_NO_EXECUTOR, f"no answer from the executor at {self.config.address}")
        message = p.decode(msg.bytes, allow_shm=False)
        if not isinstance(message, kind):
            raise ProtocolError(f"expected {kind.__name__}, got {type(message).__name__}")
        return message

    def run_initializer(self, setup: p.Setup) -> None:
        if setup.initializer is None:
            return
        try:
            fn, args = loads(setup.initializer, what="initializer")
            fn(*args)
        except BaseException as exc:
            self.send(p.InitFailed(dumps_exception(exc)))
            _die(EXIT_INIT_FAILED, f"initializer failed: {exc!r}")

    # ---------------------------------------------------------------- receiving

    def receive(self, *, block: bool) -> None:
        """Take in what the executor sent; with ``block``, wait until something arrives."""
        channel = self.channel
        msg = channel.recv(self.heartbeat) if block else channel.try_recv()
        while msg is not None:
            self.last_heard = time.monotonic()
            self._on_message(p.decode(msg.bytes, allow_shm=self.allow_shm))
            msg = channel.try_recv()
        if block and time.monotonic() - self.last_heard > 3 * self.heartbeat:
            self._executor_gone("the executor fell silent")

    def _on_message(self, message: p.Message) -> None:
        if isinstance(message, p.Tasks):
            functions = _Functions(message.functions)
            self.tasks.extend((t, functions) for t in message.tasks)
        elif isinstance(message, p.Bye):
            self.stopping = True

    def heartbeat_loop(self) -> None:
        """Tell the executor we are alive while the main thread is busy with a long task."""
        stop = threading.Event()
        while not stop.wait(self.heartbeat):
            if time.monotonic() - self.last_sent >= self.heartbeat:
                self.send(p.Heartbeat())

    def _on_disconnect(self, _pipe: object) -> None:
        self._executor_gone("the connection to the executor closed")

    def _executor_gone(self, why: str) -> None:
        if self.config.executor_id:
            _shm.remove_all(self.config.executor_id)
        _die(0, f"{why}; exiting")

    # ---------------------------------------------------------------- main thread

    def serve(self) -> None:
        done = 0
        batch = _Batch()
        while not self.stopping or self.tasks:
            if not self.tasks:
                self.flush(batch)
                self.receive(block=True)
                continue
            result = self._run(*self.tasks.popleft())
            batch.add(result)
            done += 1
            if self.max_tasks and done >= self.max_tasks:
                self.flush(batch)
                self.send(p.Bye("max_tasks_per_child reached"))
                return
            if not self.tasks:
                self.receive(block=False)
            if not self.tasks or batch.due(result.runtime):
                self.flush(batch)
        self.flush(batch)

    def _run(self, task: p.Task, functions: _Functions) -> p.Result:
        start = time.perf_counter()
        try:
            fn = functions.get(task.function)
            args, kwargs = loads(task.args, what="arguments")
            value = fn(*args, **kwargs)
        except BaseException as exc:
            payload, status = dumps_exception(exc), p.Status.RAISED
        else:
            try:
                payload, status = dumps(value, what="result"), p.Status.OK
            except SerializationError as exc:
                payload, status = dumps_exception(exc), p.Status.RAISED
        return p.Result(task.task_id, status, payload, time.perf_counter() - start)

    def flush(self, batch: _Batch) -> None:
        if batch.results:
            self.send(p.Results(batch.take()))
            with contextlib.suppress(Exception):
                sys.stdout.flush()

    def send(self, message: p.Message) -> None:
        frame = p.encode(message, self.shm)
        with self.send_lock:
            self.channel.send(frame, timeout=30.0)
            self.last_sent = time.monotonic()


class _Functions:
    """The functions one Tasks message carries, unpickled once, on first use.

    Functions pickled by value (lambdas, ``__main__``) cost tens of microseconds to unpickle,
    so recent ones are kept by their exact pickle bytes: the same bytes are the same code and
    the same captured globals. (The executor cannot cache the other way round: a global the
    function reads may change between submits.)
    """

    recent: ClassVar[OrderedDict[bytes, Any]] = OrderedDict()
    RECENT_MAX: ClassVar[int] = 64

    def __init__(self, payloads: Sequence[Payload]) -> None:
        self.payloads = payloads
        self.cache: list[Any] = [None] * len(payloads)

    def get(self, index: int) -> Any:
        fn = self.cache[index]
        if fn is None:
            fn = self.cache[index] = self._load(self.payloads[index])
        return fn

    @classmethod
    def _load(cls, payload: Payload) -> Any:
        if payload.buffers:  # large captured data: not worth keeping
            return loads(payload, what="function")
        fn = cls.recent.get(payload.data)
        if fn is None:
            fn = loads(payload, what="function")
            cls.recent[payload.data] = fn
            if len(cls.recent) > cls.RECENT_MAX:
                cls.recent.popitem(last=False)
        else:
            cls.recent.move_to_end(payload.data)
        return fn


class _Batch:
    """Finished results waiting to share one message."""

    def __init__(self) -> None:
        self.results: list[p.Result] = []
        self.nbytes = 0
        self.since = 0.0

    def add(self, result: p.Result) -> None:
        if not self.results:
            self.since = time.monotonic()
        self.results.append(result)
        self.nbytes += result.payload.nbytes

    def due(self, last_runtime: float) -> bool:
        return (
            last_runtime >= SLOW_TASK
            or len(self.results) >= FLUSH_COUNT
            or self.nbytes >= FLUSH_BYTES
            or time.monotonic() - self.since >= FLUSH_AGE
        )

    def take(self) -> list[p.Result]:
        results, self.results, self.nbytes = self.results, [], 0
        return results


def _die(code: int, why: str) -> NoReturn:
    if code:
        print(f"fiberexec worker: {why}", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(code)


def _guard(loop: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            loop()
        except BaseException as exc:  # the link is this worker's lifeline: no link, no worker
            _die(EXIT_NO_EXECUTOR, f"heartbeats to the executor failed: {exc!r}")

    return run


def main() -> None:
    """Entry point of ``python -m fiberexec.worker``."""
    try:
        config = _Config(dict(os.environ))
    except KeyError as exc:
        sys.exit(f"fiberexec worker: missing environment variable {exc}; backends set it")
    worker = Worker(config)
    try:
        setup = worker.handshake()
    except ProtocolError as exc:
        _die(EXIT_AUTH_FAILED, f"handshake failed: {exc}")
        return
    worker.run_initializer(setup)
    threading.Thread(
        target=_guard(worker.heartbeat_loop), name="fiberexec-heartbeat", daemon=True
    ).start()
    worker.serve()
    _die(0, "done")


if __name__ == "__main__":
    main()
