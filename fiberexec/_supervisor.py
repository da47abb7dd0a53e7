"""The worker supervisor: starts, watches, replaces and stops the workers the shards serve.

Workers are started by launcher threads (backend calls block on I/O and are retried with the
executor's `RetryPolicy`), so no shard ever waits on a backend. The worker table below is the
only state shared between threads, and one lock guards it. The supervisor is the shards'
`Lifecycle`: they report readiness, losses and start failures here, and it tells them about
started, failed and exited workers with events.

    launch():  (launcher) open an Endpoint -> Adopt -> backend.start_worker -> Started
               backend's exit watch -> Exited;  a peer hangs up -> PipeDown
    worker_gone / worker_failed_to_start (from a shard) -> stop its handle, maybe launch()

Once the executor is broken or shut down (`_halt` is set) nothing more is started: queued
launches return at once, a start's retries stop and its backoff ends, and a start still in
flight when it returns closes its endpoint and stops what it started. When the last ready
worker is lost with tasks outstanding, starts that keep failing for
``start_retry.deadline_without_workers`` seconds break the executor with their cause (a
timer checks, so a start that hangs cannot delay it).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from fiberexec import _auth, _contract, _syspath, _threads
from fiberexec import _events as ev
from fiberexec._backend import Backend, WorkerHandle, WorkerSpec, WorkerStatus
from fiberexec._crash import FAULT_LINES, fault_report, faulted
from fiberexec._errors import BrokenFiberExecutor
from fiberexec._link import Endpoint
from fiberexec._link_stream import TcpListener
from fiberexec._output import OutputSink
from fiberexec._pace import REFILL, Pace
from fiberexec._session import Session
from fiberexec._shard import Shard

if TYPE_CHECKING:  # tenacity loads with the first retried call (`_retry`), pynng with TLS
    import tenacity

    from fiberexec._link_nng import Channel

log = logging.getLogger("fiberexec")
MAX_START_FAILURES = 3  # workers in a row that die before connecting break the executor


class WorkerSupervisor:
    def __init__(
        self,
        session: Session,
        backend: Backend,
        *,
        outstanding: Callable[[], int],
        progress: Callable[[], None],
        sink: OutputSink | None = None,
    ) -> None:
        self.session = session
        self.config = session.config
        self.backend = backend
        self.shards: Sequence[Shard] = ()  # set by the pool once they are built
        self.broken: BrokenFiberExecutor | None = None
        self.stop_grace = 2.0  # seconds between SIGTERM and SIGKILL when stopping a worker
        self._outstanding = outstanding  # tasks submitted and not finished
        self._progress = progress
        self._sink = sink  # where forwarded task output goes
        self._lock = threading.Lock()
        self._handles: dict[str, WorkerHandle | None] = {}  # None: being started
        self._endpoints: dict[str, ev.Link] = {}  # closed by their shard, or by stop_all
        self._placement: dict[str, Shard] = {}  # worker id -> the shard that serves it
        self._served: Counter[int] = Counter()  # shard index -> workers placed on it
        self._promised = 0  # launches a launch_many has yet to make
        self._last_start_failure = ""  # how the last worker that failed to start ended
        self._retiring: set[str] = set()
        self._ready: set[str] = set()
        self._start_failures = 0
        self._ids = itertools.count()
        self._finished = False  # the shards are done: no new workers
        self._halt = threading.Event()  # broken or finished: start nothing more
        self._starving_since: float | None = None  # the last ready worker was lost then
        self._start_error: BaseException | None = None  # since a worker was last ready
        self._starving_timer: threading.Timer | None = None
        self._busy = threading.Condition(self._lock)  # launcher jobs not yet done: _active
        self._readied = threading.Condition(self._lock)  # a worker ready, or _halt set
        self._active = 0
        self._next_port = 0  # where the search for a free port in config.ports starts
        self._tls_server = self.config.tls.server_config() if self.config.tls else None
        # Starts block on backends (forks, API calls): more threads for more workers.
        threads = max(4, min(32, self.config.max_workers // 32))
        self._launcher = ThreadPoolExecutor(threads, thread_name_prefix="fiberexec-launcher")
        self._pace = Pace.for_pool(self.config.max_workers)  # replacements of lost workers
        self._deferred: set[threading.Timer] = set()  # replacements waiting for their turn

    # ------------------------------------------------------------ counts

    def counts(self) -> tuple[int, int]:
        """(workers ready, workers known: ready, starting or leaving)."""
        with self._lock:
            return len(self._ready), len(self._handles)

    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)

    @property
    def halted(self) -> bool:
        """Nothing more will start: the executor broke or shut down."""
        return self._halt.is_set()

    def wait_ready(self, count: int, timeout: float | None) -> bool:
        """Block until ``count`` workers are ready (True), or until nothing more will start
        (the executor broke or shut down) or ``timeout`` passes (False)."""
        with self._lock:
            self._readied.wait_for(lambda: len(self._ready) >= count or self._halt.is_set(),
                                   timeout)
            return len(self._ready) >= count

    def known(self) -> dict[str, WorkerHandle | None]:
        """Every worker started or being started, with its handle (None: not yet)."""
        with self._lock:
            return dict(self._handles)

    def starting(self, index: int) -> int:
        """Workers on their way to shard ``index`` (placed there, not yet authenticated),
        plus launches promised and not yet placed anywhere."""
        with self._lock:
            placed = sum(1 for w, s in self._placement.items()
                         if s.index == index and w not in self._ready)
            return placed + self._promised

    # ------------------------------------------------------------ starting workers

    def scale_up(self) -> None:
        """Start workers until there is one per outstanding task, up to ``max_workers``."""
        with self._lock:
            wanted = min(self.config.max_workers, self._outstanding()) - self._known()
        self.launch_many(wanted)

    def launch_many(self, count: int) -> None:
        """Start ``count`` more workers; the caller waits for none of it (a thousand
        launches cost tens of milliseconds on their own, so they happen elsewhere)."""
        if count == 1:
            self.launch()
        elif count > 1:
            with self._lock:
                self._promised += count
            self._in_background(self._launch_each, count)

    def _launch_each(self, count: int) -> None:
        for _ in range(count):
            self.launch(promised=True)

    def _known(self) -> int:
        """Workers started, starting, or promised by a `launch_many` under way."""
        return len(self._handles) + self._promised

    def wants_more(self) -> bool:
        return self._known() < self.config.max_workers

    def launch(self, *, promised: bool = False) -> None:
        """Start one more worker in the background: the caller never waits on a backend.
        ``promised``: one a `launch_many` counted (it is placed in the same breath, so a
        shard asking what is `starting` never misses it)."""
        with self._lock:
            if promised:
                self._promised -= 1
            if self._finished or self.broken is not None:
                return
            worker_id = f"w{next(self._ids)}"
            self._handles[worker_id] = None
            shard = min(self.shards, key=lambda s: self._served[s.index])  # fewest workers
            self._placement[worker_id] = shard
            self._served[shard.index] += 1
        self._in_background(self._open_and_start, shard, worker_id)

    def _open_and_start(self, shard: Shard, worker_id: str) -> None:
        with self._lock:
            if self._finished or self.broken is not None:
                self._handles.pop(worker_id, None)
                self._unplace(worker_id)
                return
        try:
            endpoint = self._open(shard, worker_id)
        except Exception as exc:  # no port: say why, do not leave the tasks waiting
            self._drop(worker_id)
            self.break_executor(f"could not listen for worker {worker_id}: {exc}", exc)
            return
        with self._lock:
            self._endpoints[worker_id] = endpoint
        adopt = ev.Adopt(worker_id, endpoint, _auth.new_nonce())  # (see `_protocol`)
        shard.post(adopt)
        address = self._advertised(endpoint.address)
        self._start_worker(shard, self._spec(adopt, address, endpoint.local_name))

    def _advertised(self, address: str) -> str:
        """Where workers dial a network channel listening at ``address`` ("": none)."""
        if not address:
            return ""
        scheme, rest = address.split("://", 1)
        host = self.backend.advertise_host
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{rest.rsplit(':', 1)[1]}"

    def _open(self, shard: Shard, worker_id: str) -> Endpoint:
        """The worker's endpoint: its local socket and (unless every worker of this backend
        shares our host) a network way in: a TCP port, or with TLS a pynng channel."""
        def on_remove(pipe: Any) -> None:
            shard.post(ev.PipeDown(worker_id, pipe.id))

        network = None if self.backend.workers_share_host else self._listen(on_remove)
        local_name = f"fiberexec/{os.getpid()}/{self.session.executor_id}/{worker_id}"
        try:
            return Endpoint(local_name, network, on_remove=on_remove,
                            max_frame=self.config.max_message_size)
        except BaseException:
            if network is not None:
                network.close()
            raise

    def _listen(self, on_remove: Callable[[Any], None]) -> Channel | TcpListener:
        """A worker's network way in, on the next port of the configured range."""
        host, ports, first = self.backend.bind_host, self.config.ports, self._next_port
        network: Channel | TcpListener
        if self._tls_server is None:
            network = TcpListener(host, ports=ports, first=first)
        else:
            from fiberexec._link_nng import Channel  # pynng only for workers behind TLS

            network = Channel.listen(host, max_message=self.config.max_message_size,
                                     on_connect=lambda pipe: None, on_remove=on_remove,
                                     tls=self._tls_server, ports=ports, first=first)
        self._next_port = int(network.address.rsplit(":", 1)[1]) + 1
        return network

    def _unplace(self, worker_id: str) -> None:
        """Forget where a worker was served (the caller holds the lock)."""
        shard = self._placement.pop(worker_id, None)
        if shard is not None:
            self._served[shard.index] -= 1

    def _drop(self, worker_id: str, *, keep_endpoint: bool = False) -> WorkerHandle | None:
        with self._lock:
            self._unplace(worker_id)
            if not keep_endpoint:
                self._endpoints.pop(worker_id, None)
            return self._handles.pop(worker_id, None)

    def _spec(self, adopt: ev.Adopt, address: str, local_address: str) -> WorkerSpec:
        cfg, session, worker_id = self.config, self.session, adopt.worker_id
        tls_env = {}
        if cfg.tls is not None:
            tls_env = {
                _contract.ENV_TLS_CERT: cfg.tls.cert,
                _contract.ENV_TLS_SERVER_NAME: cfg.tls.server_name or self.backend.advertise_host,
            }
        threads = _threads.share(cfg.resources.cpu, cfg.max_workers,
                                 self.backend.workers_share_host)
        threads_env = {} if threads is None else {_contract.ENV_THREADS: str(threads)}
        return WorkerSpec(
            worker_id=worker_id,
            executor_id=session.executor_id,
            command=_contract.WORKER_COMMAND,
            env={
                **cfg.env,  # the user's (never the contract's: FIBEREXEC_* names are refused)
                _contract.ENV_ADDRESS: address,
                _contract.ENV_LOCAL_ADDRESS: local_address,
                _contract.ENV_WORKER_ID: worker_id,
                _contract.ENV_EXECUTOR_ID: session.executor_id,
                _contract.ENV_HEARTBEAT: str(cfg.heartbeat),
                _contract.ENV_SILENCE: str(cfg.silence_timeout),
                _contract.ENV_CONNECT_TIMEOUT: str(cfg.start_timeout),
                _contract.ENV_NONCE: adopt.nonce.hex(),
                _syspath.ENV_SYS_PATH: _syspath.export(),
                **threads_env,
                **tls_env,
            },
            secret_env={
                _contract.ENV_SECRET: session.secret.hex(),
                # stdlib Manager proxies passed to tasks authenticate with it, as in a child
                _contract.ENV_MP_AUTHKEY: bytes(multiprocessing.current_process().authkey).hex(),
            },
            image=cfg.image,
            workdir=cfg.workdir or os.getcwd(),
            script_dir=_syspath.script_dir(),
            resources=cfg.resources,
            labels=cfg.labels,
        )

    def _start_worker(self, shard: Shard, spec: WorkerSpec) -> None:
        def attempt() -> WorkerHandle:
            return self.backend.start_worker(spec)

        def retrying(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("starting worker %s failed (%s); retrying", spec.worker_id, exc)
            if exc is not None:
                self._start_failed(exc)

        try:
            handle = self.config.start_retry.call(attempt, before_sleep=retrying,
                                                  abandon=self._halt)
        except Exception as exc:
            shard.post(ev.StartFailed(spec.worker_id))
            # Its endpoint stays listed until `stop_all`, which closes it if the shard did
            # not: a shard that ended before it saw this worker never will.
            self._drop(spec.worker_id, keep_endpoint=True)
            self._close_endpoint(spec.worker_id)  # now, if `stop_all` has run
            if self._halt.is_set():  # broken or shut down meanwhile: nothing more to say
                return
            self.break_executor(
                f"could not start a worker on the {self.backend.name!r} backend: {exc}", exc
            )
            return
        with self._lock:
            too_late = self._finished
            if not too_late:
                self._handles[spec.worker_id] = handle
        if too_late:  # started after shutdown began: nobody will serve it
            self._stop(handle)  # before its endpoint closes, which it would report
            self._close_endpoint(spec.worker_id)
            return
        log.info("started worker %s of executor %s (%s)", spec.worker_id,
                 self.session.executor_id, handle.ref)
        shard.post(ev.Started(spec.worker_id, handle))
        self.backend.watch(handle, partial(self._exited, shard))

    def _exited(self, shard: Shard, handle: WorkerHandle, status: WorkerStatus) -> None:
        """Tell the shard; a worker that a fault in native code ended wrote where in its log
        (`faulthandler`): read it off the backend's thread, and send it along."""
        if not faulted(status):
            shard.post(ev.Exited(handle.worker_id, status))
            return

        def with_report() -> None:
            try:
                report = fault_report(self.backend.logs(handle, tail=FAULT_LINES))
            except Exception as exc:  # an engine or cluster that cannot say: no report
                log.debug("could not read worker %s's log: %s", handle.worker_id, exc)
                report = ""
            shard.post(ev.Exited(handle.worker_id, status, report))

        self._in_background(with_report)

    def _close_endpoint(self, worker_id: str) -> None:
        with self._lock:
            endpoint = self._endpoints.pop(worker_id, None) if self._finished else None
        if endpoint is not None:  # its shard has finished: nobody else will close it
            endpoint.close()

    # ------------------------------------------------------------ no worker left

    def _start_failed(self, exc: BaseException) -> None:
        """A start attempt failed: remember why and, if every worker is lost, maybe give up."""
        with self._lock:
            self._start_error = exc
        self._check_starving()

    def _starve(self) -> None:
        """The last ready worker is gone with tasks outstanding (the caller holds the lock)."""
        window = self.config.start_retry.deadline_without_workers
        self._starving_since = time.monotonic()
        if self._starving_timer is not None:
            self._starving_timer.cancel()
        self._starving_timer = threading.Timer(window, self._check_starving)
        self._starving_timer.daemon = True
        self._starving_timer.start()

    def _fed(self) -> None:
        """A worker is ready, or nothing more will start: the executor is not starving, and
        `wait_ready` looks again (the caller holds the lock)."""
        self._readied.notify_all()
        self._starving_since = self._start_error = None
        if self._starving_timer is not None:
            self._starving_timer.cancel()
            self._starving_timer = None

    def _check_starving(self) -> None:
        """Break once every worker has been lost for the window and a start has failed
        since a worker was last ready."""
        window = self.config.start_retry.deadline_without_workers
        with self._lock:
            since, error = self._starving_since, self._start_error
            if since is None or error is None or self._halt.is_set() or self._ready:
                return
            due = time.monotonic() - since >= window
        if due:
            self.break_executor(
                f"every worker was lost and none could be started on the {self.backend.name!r} "
                f"backend for {window:g}s (start_retry.deadline_without_workers); the last "
                f"start failed: {error}", error)

    # ------------------------------------------------------------ the shards' Lifecycle

    def worker_ready(self, worker_id: str) -> None:
        with self._lock:
            self._ready.add(worker_id)
            self._start_failures = 0
            self._fed()

    def worker_gone(self, worker_id: str, handle: WorkerHandle | None, *, replace: bool,
                    lost: bool = False, waiting: Callable[[], bool] | None = None) -> None:
        with self._lock:
            self._handles.pop(worker_id, None)
            self._unplace(worker_id)
            self._endpoints.pop(worker_id, None)
            was_ready = worker_id in self._ready
            self._ready.discard(worker_id)
            if was_ready and not self._ready and self._outstanding() > 0:
                self._starve()
            retired = worker_id in self._retiring
            self._retiring.discard(worker_id)
            wanted = replace and self._known() < self.config.max_workers and (
                # a worker that retired while a task came (a submit saw it and started none)
                bool(waiting and waiting()) if retired
                else self._known() < self.config.min_workers or self._outstanding() > 0
            )
        if handle is not None:
            self._in_background(self._stop, handle)
        if wanted:
            self._replace(lost)

    def _replace(self, lost: bool) -> None:
        """Start a worker for one that left; for a lost one, at the pace `Pace` allows."""
        with self._lock:
            delay = self._pace.wait() if lost else 0.0
            deferred = delay > 0 and not (self._finished or self.broken is not None)
            if deferred:
                self._promised += 1  # counted as known until it starts
                first = self._pace.deferred == 1
        if not deferred:
            self.launch()
            return
        log.log(logging.WARNING if first else logging.DEBUG,
                "workers are being lost faster than %d per %.0fs; replacing them at that pace",
                self._pace.burst, REFILL)
        self._defer(delay)

    def _defer(self, delay: float) -> None:
        def fire() -> None:
            with self._lock:
                self._promised -= 1
                self._deferred.discard(timer)
            self.launch()

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        with self._lock:
            if self._halt.is_set():  # stopped or broken meanwhile: nothing to replace
                self._promised -= 1
                return
            self._deferred.add(timer)
        timer.start()

    def worker_failed_to_start(self, worker_id: str, status: WorkerStatus | None) -> None:
        handle = self._drop(worker_id)
        with self._lock:
            self._start_failures += 1
            give_up = self._start_failures >= MAX_START_FAILURES
        self._in_background(self._diagnose_start_failure, worker_id, handle, status, give_up)

    def _diagnose_start_failure(
        self, worker_id: str, handle: WorkerHandle | None, status: WorkerStatus | None,
        give_up: bool,
    ) -> None:
        what = (f"{status.describe()} before connecting to the executor" if status else
                f"did not connect to the executor within start_timeout="
                f"{self.config.start_timeout}s")
        try:
            logs = self.backend.logs(handle, tail=20).strip() if handle else ""
        except Exception as exc:  # an engine or cluster that cannot say: the error says less
            log.debug("could not read worker %s's log: %s", worker_id, exc)
            logs = ""
        message = f"worker {worker_id} {what}"
        if logs:
            message += f"; its last output:\n{logs}"
        elif self.backend.workers_share_host:  # (output= rules only what tasks print)
            message += "; what it wrote before it connected went to this program's stderr"
        if handle is not None:
            self._stop(handle)
        with self._lock:  # the same failure again says nothing new: once is enough
            repeated, self._last_start_failure = self._last_start_failure == what, what
        log.log(logging.DEBUG if repeated else logging.WARNING, "%s", message)
        if not give_up:
            self.launch()
        elif self.ready_count():  # e.g. jobs still queued on a busy cluster: go on with these
            log.warning("%d workers in a row failed to start; going on with the ones "
                        "connected, and trying again as tasks arrive", MAX_START_FAILURES)
        else:
            self.break_executor(f"{MAX_START_FAILURES} workers in a row failed to start; "
                                f"the last: {message}", None)

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
            self._halt.set()  # nothing more is started; retries under way stop
            self._fed()
            deferred, self._deferred = self._deferred, set()
        for timer in deferred:
            timer.cancel()
        log.log(level, "%s", message)
        for shard in self.shards:
            shard.post(ev.Broken(self.broken))

    def progress(self) -> None:
        self._progress()

    def output(self, worker_id: str, host: str, stdout: bytes, stderr: bytes) -> None:
        if self._sink is not None:
            self._sink.put(worker_id, host, stdout, stderr)

    # ------------------------------------------------------------ stopping

    def _stop(self, handle: WorkerHandle) -> None:
        try:
            self.backend.stop(handle, grace=self.stop_grace)
        except Exception as exc:
            log.warning("could not stop worker %s: %s", handle.worker_id, exc)

    def _in_background(self, fn: Callable[..., None], *args: object) -> None:
        with self._lock:
            self._active += 1
        try:
            self._launcher.submit(self._counted, fn, *args)
            return
        except RuntimeError:  # the launcher is shutting down: do it here
            pass
        self._counted(fn, *args)

    def _counted(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:  # (a fault of ours: tasks would wait for workers forever)
            log.error("the worker supervisor failed in %s", getattr(fn, "__name__", fn),
                      exc_info=True)
            self.break_executor(f"fiberexec's worker supervisor failed: {exc!r} (a bug in "
                                "fiberexec: please report it with the log)", exc,
                                level=logging.DEBUG)  # (logged above, with its traceback)
        finally:
            with self._busy:
                self._active -= 1
                self._busy.notify_all()

    def stop_all(self, left_open: Mapping[str, ev.Link] | None = None) -> None:
        """The shards are done: start nothing more, stop every worker left. ``left_open``:
        the endpoints of workers still starting, which the shards left for us to close once
        those workers are stopped (a worker that finds its endpoint gone says so)."""
        with self._lock:
            self._finished = True
            self._halt.set()
            self._fed()
            handles = [h for h in self._handles.values() if h is not None]
            # a start in flight stops its worker, then closes its endpoint (_start_worker)
            in_flight = {w for w, h in self._handles.items() if h is None}
            self._handles.clear()
            self._ready.clear()  # none serves any more: stats() counts no worker
            deferred, self._deferred = self._deferred, set()
        for timer in deferred:  # replacements waiting for their turn: none is wanted now
            timer.cancel()
        for handle in handles:
            self._stop(handle)
        self._launcher.shutdown(wait=False)  # queued launches return at once (_halt)
        # Closed only now, after their workers were stopped: a worker still starting that
        # found its endpoint gone would report the executor's hang-up as a fault. One whose
        # start is in flight is closed when that start returns (`_start_worker`).
        with self._lock:
            for worker_id, link in (left_open or {}).items():
                self._endpoints.setdefault(worker_id, link)
            endpoints = [e for w, e in self._endpoints.items() if w not in in_flight]
            for worker_id in list(self._endpoints):
                if worker_id not in in_flight:
                    del self._endpoints[worker_id]
        for endpoint in endpoints:
            endpoint.close()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the launcher's jobs (starts in flight, stops); True
        if none is left. One still running cleans up after itself (`_start_worker`)."""
        deadline = time.monotonic() + timeout
        with self._busy:
            return self._busy.wait_for(lambda: self._active == 0,
                                       max(0.0, deadline - time.monotonic()))
