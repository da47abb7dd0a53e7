"""The task pool: shards that schedule, and the lifecycle of the workers they serve.

Workers are started by launcher threads (backend calls block on I/O and are retried with the
executor's `RetryPolicy`), so no shard ever waits on a backend. The worker table below is the
pool's only shared state and is guarded by one lock; scheduling state lives in the shards.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fiberexec import _auth, _contract, _fdlimit, _shm
from fiberexec._backend import Backend, WorkerHandle, WorkerSpec, WorkerStatus
from fiberexec._channel import Channel
from fiberexec._config import ExecutorConfig
from fiberexec._conn import Conn
from fiberexec._errors import BrokenFiberExecutor
from fiberexec._serialize import Payload, dumps
from fiberexec._shard import Shard
from fiberexec._stats import Stats
from fiberexec._task import WorkItem
from fiberexec._tls import ENV_TLS_CERT, ENV_TLS_SERVER_NAME

log = logging.getLogger("fiberexec")
MAX_START_FAILURES = 3  # workers in a row that die before connecting break the executor
PROGRESS_INTERVAL = 0.1


class TaskPool:
    def __init__(
        self,
        config: ExecutorConfig,
        backend: Backend,
        *,
        owns_backend: bool,
        progress: Callable[[Stats], None] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.owns_backend = owns_backend
        self.progress = progress
        self.executor_id = secrets.token_hex(4)
        self.secret = _auth.new_secret()
        self.shards = [Shard(self, i) for i in range(config.shards)]
        self.initializer: Payload | None = None
        self.shm_token = b""  # what a worker must read from a handshake's probe file
        self.broken: BrokenFiberExecutor | None = None
        self._lock = threading.Lock()
        self._handles: dict[str, WorkerHandle | None] = {}
        self._placement: dict[str, Shard] = {}  # worker id -> the shard that serves it
        self._retiring: set[str] = set()
        self._ready: set[str] = set()
        self._start_failures = 0
        self._ids = itertools.count()
        self._next_shard = itertools.count()
        self._submitted = 0
        self._launcher: ThreadPoolExecutor | None = None
        self._closing = False  # shutdown() was called: no new tasks
        self._finished = False  # the shards are done: no new workers
        self._closed = threading.Event()  # everything is stopped and cleaned up
        self._t0 = 0.0
        self._tls_server: object | None = None
        self._last_progress = 0.0
        self.stop_grace = 2.0  # seconds between SIGTERM and SIGKILL when stopping a worker
        self._next_port = 0  # where the search for a free port in config.ports starts

    # ------------------------------------------------------------ submitting

    def submit(self, item: WorkItem) -> None:
        if self._launcher is None:
            self._start()
        self._submitted += 1
        self.shards[next(self._next_shard) % len(self.shards)].put(item)
        if len(self._handles) < self.config.max_workers:
            self._scale_up()

    def _start(self) -> None:
        _fdlimit.ensure(self.config.max_workers)
        self._t0 = time.monotonic()
        self._launcher = ThreadPoolExecutor(4, thread_name_prefix="fiberexec-launcher")
        if self.config.tls is not None:
            self._tls_server = self.config.tls.server_config()
        if self.config.initializer is not None:
            self.initializer = dumps(
                (self.config.initializer, self.config.initargs), what="initializer"
            )
        if _shm.available():
            self.shm_token = secrets.token_bytes(32)
        for shard in self.shards:
            shard.thread.start()
        for _ in range(self.config.min_workers):
            self._launch()

    def _outstanding(self) -> int:
        finished = sum(s.done + s.failed for s in self.shards)
        return self._submitted - finished

    def _scale_up(self) -> None:
        with self._lock:
            wanted = min(self.config.max_workers, self._outstanding()) - len(self._handles)
        for _ in range(max(0, wanted)):
            self._launch()

    # ------------------------------------------------------------ starting workers

    def _launch(self) -> None:
        with self._lock:
            if self._finished or self.broken is not None:
                return
            worker_id = f"w{next(self._ids)}"
            self._handles[worker_id] = None
            load = {id(s): 0 for s in self.shards}
            for placed in self._placement.values():
                load[id(placed)] += 1
            shard = min(self.shards, key=lambda s: load[id(s)])
            self._placement[worker_id] = shard
        try:
            channel = Channel.listen(
                self.backend.bind_host,
                max_message=self.config.max_message_size,
                on_connect=lambda pipe: None,
                on_remove=lambda pipe: shard.post("pipe_down", worker_id, pipe.id),
                tls=self._tls_server,
                ports=self.config.ports,
                first=self._next_port,
            )
        except Exception as exc:  # no port: say why, do not leave the tasks waiting
            with self._lock:
                self._handles.pop(worker_id, None)
                self._placement.pop(worker_id, None)
            self.break_executor(f"could not listen for worker {worker_id}: {exc}", exc)
            return
        self._next_port = int(channel.address.rsplit(":", 1)[1]) + 1
        shard.post("adopt", Conn(worker_id, channel, self.config.max_tasks_per_child or 0))
        scheme, rest = channel.address.split("://", 1)
        host = self.backend.advertise_host
        address = f"{scheme}://{f'[{host}]' if ':' in host else host}:{rest.rsplit(':', 1)[1]}"
        assert self._launcher is not None
        self._launcher.submit(self._start_worker, shard, self._spec(worker_id, address))

    def _spec(self, worker_id: str, address: str) -> WorkerSpec:
        cfg = self.config
        tls_env = {}
        if cfg.tls is not None:
            tls_env = {
                ENV_TLS_CERT: cfg.tls.cert,
                ENV_TLS_SERVER_NAME: cfg.tls.server_name or self.backend.advertise_host,
            }
        return WorkerSpec(
            worker_id=worker_id,
            executor_id=self.executor_id,
            command=_contract.WORKER_COMMAND,
            env={
                _contract.ENV_ADDRESS: address,
                _contract.ENV_WORKER_ID: worker_id,
                _contract.ENV_EXECUTOR_ID: self.executor_id,
                _contract.ENV_HEARTBEAT: str(cfg.heartbeat),
                _contract.ENV_CONNECT_TIMEOUT: str(cfg.start_timeout),
                **tls_env,
            },
            secret_env={
                _contract.ENV_SECRET: self.secret.hex(),
                # stdlib Manager proxies passed to tasks authenticate with it, as in a child
                _contract.ENV_MP_AUTHKEY: bytes(multiprocessing.current_process().authkey).hex(),
            },
            image=cfg.image,
            workdir=cfg.workdir or os.getcwd(),
            resources=cfg.resources,
            labels=cfg.labels,
        )

    def _start_worker(self, shard: Shard, spec: WorkerSpec) -> None:
        def attempt() -> WorkerHandle:
            return self.backend.start_worker(spec)

        try:
            handle = self.config.start_retry.call(
                attempt,
                before_sleep=lambda state: log.warning(
                    "starting worker %s failed (%s); retrying", spec.worker_id,
                    state.outcome.exception() if state.outcome else "?",
                ),
            )
        except Exception as exc:
            shard.post("start_failed", spec.worker_id)
            with self._lock:
                self._handles.pop(spec.worker_id, None)
                self._placement.pop(spec.worker_id, None)
            self.break_executor(
                f"could not start a worker on the {self.backend.name!r} backend: {exc}", exc
            )
            return
        with self._lock:
            self._handles[spec.worker_id] = handle
            too_late = self._finished
        log.info("started worker %s (%s)", spec.worker_id, handle.ref)
        shard.post("started", spec.worker_id, handle)
        self.backend.watch(handle, lambda h, status: shard.post("exited", h.worker_id, status))
        if too_late:
            self._stop(handle)

    # ------------------------------------------------------------ called by shards

    def worker_ready(self, worker_id: str) -> None:
        with self._lock:
            self._ready.add(worker_id)
            self._start_failures = 0

    def worker_gone(self, worker_id: str, handle: WorkerHandle | None, *, replace: bool) -> None:
        with self._lock:
            self._handles.pop(worker_id, None)
            self._placement.pop(worker_id, None)
            self._ready.discard(worker_id)
            retired = worker_id in self._retiring
            self._retiring.discard(worker_id)
            wanted = not retired and replace and len(self._handles) < self.config.max_workers
            wanted = wanted and (
                len(self._handles) < self.config.min_workers or self._outstanding() > 0
            )
        if handle is not None:
            self._in_background(self._stop, handle)
        if wanted:
            self._launch()

    def worker_failed_to_start(self, worker_id: str, status: WorkerStatus | None) -> None:
        with self._lock:
            handle = self._handles.pop(worker_id, None)
            self._placement.pop(worker_id, None)
            self._start_failures += 1
            give_up = self._start_failures >= MAX_START_FAILURES
        self._in_background(self._diagnose_start_failure, worker_id, handle, status, give_up)

    def _diagnose_start_failure(
        self, worker_id: str, handle: WorkerHandle | None, status: WorkerStatus | None,
        give_up: bool,
    ) -> None:
        what = status.describe() if status else (
            f"did not connect within start_timeout={self.config.start_timeout}s"
        )
        logs = self.backend.logs(handle, tail=20).strip() if handle else ""
        message = f"worker {worker_id} {what} before connecting to the executor"
        if logs:
            message += f"; its last output:\n{logs}"
        if handle is not None:
            self._stop(handle)
        log.warning("%s", message)
        if not give_up:
            self._launch()
        elif self.ready_count():  # e.g. jobs still queued on a busy cluster: go on with these
            log.warning("%d workers in a row failed to start; going on with the ones "
                        "connected, and trying again as tasks arrive", MAX_START_FAILURES)
        else:
            self.break_executor(f"{MAX_START_FAILURES} workers in a row failed to start; "
                                f"the last: {message}", None)

    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)

    def may_retire(self, worker_id: str) -> bool:
        """Whether an idle worker may leave without going below ``min_workers``."""
        with self._lock:
            active = len(self._handles) - len(self._retiring)
            if active <= self.config.min_workers:
                return False
            self._retiring.add(worker_id)
            return True

    def break_executor(
        self, message: str, cause: BaseException | None, *, level: int = logging.ERROR
    ) -> None:
        with self._lock:
            if self.broken is not None:
                return
            self.broken = BrokenFiberExecutor(message)
            self.broken.__cause__ = cause
        log.log(level, "%s", message)
        for shard in self.shards:
            shard.post("broken", self.broken)

    def report_progress(self) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL or self._outstanding() == 0:
            self._last_progress = now
            self.progress(self.stats())

    # ------------------------------------------------------------ stopping

    def _stop(self, handle: WorkerHandle) -> None:
        try:
            self.backend.stop(handle, grace=self.stop_grace)
        except Exception as exc:
            log.warning("could not stop worker %s: %s", handle.worker_id, exc)

    def _in_background(self, fn: Callable[..., None], *args: object) -> None:
        launcher = self._launcher
        try:
            if launcher is not None:
                launcher.submit(fn, *args)
                return
        except RuntimeError:  # the launcher is shutting down: do it here
            pass
        fn(*args)

    def interpreter_exiting(self) -> None:
        """The interpreter is exiting: tasks still run, but no worker is awaited for long."""
        for shard in self.shards:
            shard.post("exiting")

    def force_stop(self, message: str, *, grace: float) -> None:
        """Cancel what has not started, fail what runs, stop every worker (no waiting)."""
        self.stop_grace = grace
        self.shutdown(wait=False, cancel_futures=True)
        self.break_executor(message, None, level=logging.INFO)

    def shutdown(self, *, wait: bool, cancel_futures: bool) -> None:
        with self._lock:
            already = self._closing
            self._closing = True
        if not already:
            for shard in self.shards:
                shard.post("shutdown", cancel_futures)
            threading.Thread(target=self._finish, name="fiberexec-shutdown", daemon=True).start()
        if wait:
            self._closed.wait()

    def _finish(self) -> None:
        try:
            self._stop_everything()
        finally:
            self._closed.set()

    def _stop_everything(self) -> None:
        for shard in self.shards:
            if shard.thread.is_alive():
                shard.thread.join()
        with self._lock:
            self._finished = True
            handles = [h for h in self._handles.values() if h is not None]
            self._handles.clear()
        for handle in handles:
            self._stop(handle)
        if self._launcher is not None:
            self._launcher.shutdown(wait=True)
        if self.owns_backend:
            self.backend.close()
        _shm.remove_all(self.executor_id)
        self._closed.set()

    # ------------------------------------------------------------ stats

    def stats(self) -> Stats:
        shards = self.shards
        done = sum(s.done for s in shards)
        failed = sum(s.failed for s in shards)
        elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        with self._lock:
            ready, total = len(self._ready), len(self._handles)
        return Stats(
            workers=ready,
            workers_starting=max(0, total - ready),
            tasks_pending=sum(s.backlog for s in shards),
            tasks_running=sum(s.running for s in shards),
            tasks_done=done,
            tasks_failed=failed,
            tasks_retried=sum(s.retried for s in shards),
            tasks_stolen=sum(s.stolen for s in shards),
            workers_lost=sum(s.lost for s in shards),
            messages_rejected=sum(s.rejected for s in shards),
            throughput=(done + failed) / elapsed if elapsed > 0 else 0.0,
        )
