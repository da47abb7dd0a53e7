"""Workers as local processes: the default backend.

Each worker is ``sys.executable -m fiberexec.worker`` in its own session (so a terminal's
Ctrl-C reaches only the program, which then shuts its workers down). ``memory=`` becomes the
worker process's address-space limit (``RLIMIT_AS``), set before the worker program starts;
``cpu`` and ``gpu`` are not enforced here. Output goes to the
parent's stdout/stderr as with `multiprocessing`, or, with ``capture_output=True``, to a log
file per worker that `logs` reads back. One reaper thread (``_local_reaper``) waits for every
worker's exit and reports it to `watch` listeners through the backend's `ExitWatch`.

The ``fiberexec`` command's capabilities: `launch_master` runs the program as a child process,
`probe` always answers usable, `remove_stray` stops worker processes whose executor is gone
(``_local_stray``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from fiberexec.backend import (
    ENV_LOCAL_ADDRESS,
    ENV_PRELOAD,
    WORKER_COMMAND,
    WORKER_PROGRAM,
    Backend,
    ConfigurationError,
    ExitListener,
    ExitWatch,
    ForkedProcess,
    Launcher,
    LauncherError,
    MasterRequest,
    PermanentBackendError,
    Probe,
    Sweep,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    share_resource_tracker,
    shared_launchers,
    thread_key,
    thread_limits,
)
from fiberexec.backends._local_reaper import Reaper, open_pidfd
from fiberexec.backends._local_stray import ENV_EXECUTOR_PID, executor_pid, remove_stray_local

log = logging.getLogger("fiberexec")

#: Runs first in a memory-limited worker's process: set the limit (within any hard limit the
#: process already has), then become the worker program (the pid and the limit survive exec).
_SET_ADDRESS_SPACE_LIMIT = """\
import os, resource, sys
limit = int(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_AS)
if hard != resource.RLIM_INFINITY:
    limit = min(limit, hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
os.execvp(sys.argv[2], sys.argv[2:])
"""


#: glibc gives threads malloc arenas that each reserve 64 MiB of address space, at moments no one
#: chooses; under an address-space limit that makes what fits depend on luck, so a
#: memory-limited worker has one arena unless its environment says otherwise.
_ARENAS = "MALLOC_ARENA_MAX"

#: Signals that end a worker because someone sent them, never because memory ran out.
_STOPPED_BY_SOMEONE = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})


_PATH_FLAGS = frozenset({"-E", "-I", "-s", "-S", "-P"})
FRESH_FIRST = 2  # workers started as new processes before the launcher takes over (as many
# as a small machine's cores: a pool of that size never needs the launcher)
LAUNCHER_RESTARTS = 3  # launchers that forked workers and then died (killed) are replaced up
# to this many times; after that, or if one fails before it forks, workers start afresh
LAUNCHER_EXIT_WAIT = 1.0  # seconds a launcher whose socket closed is given to have exited
EXIT_READ_WAIT = 1.0  # seconds an exit seen is given to be read while another thread reads it


_STARTED = [0]  # local backends of this process that started workers afresh


def _key(worker_id: str, pid: int | str) -> str:
    """A worker process's key in its backend: its id and pid (executors that share the
    backend at once each have a ``w0``)."""
    return f"{worker_id} {pid}"


def _group_of(program: str) -> int | None:
    """The process group a forked ``program`` joins: a worker none (a group of its own,
    out of the terminal's reach); a `fiberexec.multiprocessing.Process` this process's, so
    the terminal's Ctrl-C reaches it as it reaches a stdlib child."""
    return None if program == WORKER_PROGRAM else os.getpgrp()


def _kill_group(pid: int) -> None:
    """SIGKILL the process group a worker leads (it is alive: its grace ran out), so what
    it forked goes with it: a task that left a fork-context pool open left its workers, hung
    in the worker's exit and then orphaned, holding the program's stdout (a pipe into
    ``| cat`` never ended). A `Process` child, in its parent's group, leads none."""
    with contextlib.suppress(OSError):  # gone meanwhile: its group goes on below, or is empty
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)


def _executor_pid() -> str:
    """This process, as its workers name it (for ``fiberexec cleanup``: see _local_stray)."""
    pid = os.getpid()
    named = _EXECUTOR_PIDS.get(pid)
    if named is None:  # read once per process: /proc costs a file open per worker otherwise
        named = _EXECUTOR_PIDS[pid] = executor_pid(pid)
    return named


_EXECUTOR_PIDS: dict[int, str] = {}


def _pass_signals_on(proc: subprocess.Popen[bytes]) -> dict[int, Any]:
    """Send ``proc`` the termination signals this process gets; the handlers they replace."""
    def pass_on(sig: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(sig)

    replaced: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        try:
            replaced[sig] = signal.signal(sig, pass_on)
        except ValueError:  # not the main thread: the program keeps the default handling
            break
    return replaced


def _address_space_limited(command: list[str], memory: int | None) -> list[str]:
    """``command``, started under an address-space limit of ``memory`` bytes when given."""
    if memory is None:
        return command
    return [sys.executable, "-I", "-S", "-c", _SET_ADDRESS_SPACE_LIMIT, str(memory), *command]


class LocalBackend(Backend):
    """Run each worker as a child process of this one, listening on loopback only.

    Args:
        capture_output: keep each worker's output in a log file instead of passing it through.
        python: the interpreter that runs workers (default: this one).

    A worker's ``memory`` is a limit on its address space (``RLIMIT_AS``), which counts
    virtual memory, not only what is resident: the interpreter, its threads' stacks and the
    modules a task imports count too (a worker with numpy loaded maps a few hundred MB), so
    leave room for them above what tasks allocate (a bare worker needs about 150 MB). An
    allocation beyond the limit raises `MemoryError` in the task (its future raises it); the
    worker lives on. Processes a task starts inherit the same limit, each on its own. Such a
    worker runs with ``MALLOC_ARENA_MAX=1`` (unless set) so that glibc's per-thread malloc
    arenas, 64 MiB of address space each, do not take the room.

    Example:
        >>> from fiberexec import FiberExecutor
        >>> with FiberExecutor(2, backend=LocalBackend()) as ex:  # doctest: +SKIP
        ...     ex.submit(abs, -1).result()
        1
    """

    name = "local"
    resource_limits: ClassVar[Mapping[str, str]] = {
        "memory": "each worker process's address space (RLIMIT_AS: virtual memory)",
    }
    shares_python = True
    workers_share_host = True

    def __init__(self, *, capture_output: bool = False, python: str | None = None,
                 launcher: bool = True) -> None:
        self.capture_output = capture_output
        self.python = python or sys.executable
        # This interpreter's options (-O, -W, -X dev...) for its workers, as the stdlib's
        # spawn and forkserver give their children; another interpreter gets none. Not those
        # that hide where modules are (-E, -I, -s, -S, -P): a stdlib child needs only the
        # stdlib, a worker needs fiberexec and its dependencies (the parent's sys.path
        # reaches it after they are imported).
        ours = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        self.flags = ([flag for flag in ours if flag not in _PATH_FLAGS]
                      if self.python == sys.executable else [])
        self.use_launcher = launcher
        # the program's launchers this backend forks from, by the thread variables their
        # imports were set up under (`fiberexec.backend.thread_limits`)
        self._launchers: dict[tuple[tuple[str, str], ...], Launcher] = {}
        # "<worker id> <pid>" -> its process: executors that share the backend at once
        # each have a w0 (see `_key`)
        self._procs: dict[str, subprocess.Popen[bytes] | ForkedProcess] = {}
        self._forked: dict[int, str] = {}  # pid of a forked worker -> its key
        self._fresh = 0  # workers started as new processes while the launcher starts
        self._memory: dict[str, int] = {}  # key -> its address-space limit, when set
        self._closes = 0  # calls of close(): a start it overtook is not a launcher failure
        self._restarts = 0  # launchers replaced after they died (`LAUNCHER_RESTARTS`)
        self._lock = threading.Lock()
        self._logdir: Path | None = None
        self._exit_watch = ExitWatch(key=lambda handle: _key(handle.worker_id, handle.ref))
        self._reaper = Reaper(self._exited)

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        if spec.workdir and not os.path.isdir(spec.workdir):
            raise PermanentBackendError(
                f"cannot start worker {spec.worker_id}: its working directory "
                f"{spec.workdir!r} (the workdir setting) is not a directory here; create it, "
                "or set workdir to one")
        # Every worker names this process: its executor's lease here (``fiberexec cleanup``).
        env = {**os.environ, **spec.env, **spec.secret_env, ENV_EXECUTOR_PID: _executor_pid()}
        threads = thread_limits(env)  # (set now: a forked worker's launcher imports under them)
        program = self._forks(spec)
        closes = self._closes
        if program is not None and not self._first_ones(program, threads):
            try:
                return self._fork_worker(spec, env, program, closes, threads)
            except LauncherError as exc:
                if self._closes != closes:  # closed meanwhile, launcher and all: start nothing
                    raise PermanentBackendError(
                        f"cannot start worker {spec.worker_id}: the backend was closed while "
                        "it started") from None
                with self._lock:  # the launcher cannot run: start workers afresh
                    first, self.use_launcher = self.use_launcher, False
                if first:  # said once, though several starts failed with it
                    log.warning("the worker launcher failed (%s); starting each worker as a "
                                "new process instead", exc)
        return self._spawn_worker(spec, env)

    def _spawn_worker(self, spec: WorkerSpec, env: dict[str, str]) -> WorkerHandle:
        command = list(spec.command)
        if command[:1] == ["python"]:
            command[:1] = [self.python, *self.flags]
        command = _address_space_limited(command, spec.resources.memory)
        if spec.resources.memory is not None:
            env.setdefault(_ARENAS, "1")
        output = self._output(spec.worker_id)
        tracker = share_resource_tracker(env)  # (a fork of the launcher is handed it too)
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                cwd=spec.workdir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT if self.capture_output else None,
                # a worker: a process group of its own (in our session: see the
                # launcher's `_detach`); a Process: in ours, as a stdlib child
                process_group=0 if tuple(spec.command) == WORKER_COMMAND else None,
                close_fds=True,
                pass_fds=tracker,
            )
        except FileNotFoundError as exc:
            raise PermanentBackendError(
                f"cannot start worker {spec.worker_id}: {command[0]!r} not found; "
                "pass python= to LocalBackend"
            ) from exc
        except (BlockingIOError, OSError) as exc:  # EAGAIN/ENOMEM: fork limits, may pass
            raise TransientBackendError(f"cannot start worker {spec.worker_id}: {exc}") from exc
        finally:
            if output is not None:
                os.close(output)  # the child has its copy; ours would leak one per worker
        pidfd = open_pidfd(proc)  # before anyone can reap it, so its pid is never recycled
        key = _key(spec.worker_id, proc.pid)
        with self._lock:
            self._procs[key] = proc
            if spec.resources.memory is not None:
                self._memory[key] = spec.resources.memory
        self._reaper.add(key, pidfd, proc)
        return WorkerHandle(spec.worker_id, str(proc.pid))

    def _forks(self, spec: WorkerSpec) -> str | None:
        """The program to fork from the launcher, or None to start a new process.

        Forked: an executor's worker program (its process names its executor, as
        ``fiberexec cleanup`` needs) and fiberexec's other ``python -m fiberexec...``
        programs (a `fiberexec.multiprocessing.Process`), without an address-space limit (a
        forked child keeps the launcher's malloc arenas, so the limit would fit by luck)."""
        command = tuple(spec.command)
        if not self.use_launcher or spec.resources.memory is not None:
            return None
        if command == WORKER_COMMAND:
            return WORKER_PROGRAM if ENV_LOCAL_ADDRESS in spec.env else None
        if len(command) == 3 and command[:2] == ("python", "-m") and command[2].startswith(
                "fiberexec."):
            return command[2]
        return None

    def _first_ones(self, program: str, threads: dict[str, str]) -> bool:
        """Whether this worker starts as a new process: the first `FRESH_FIRST` do, unless
        this program's launcher runs already (a small pool's first result comes as soon as
        a spawned worker's would, with no launcher to start beside it); the launcher starts
        for the next one and serves every worker after them, of this executor and of those
        made after it. Where an executor was made before this one, the launcher starts
        beside its first workers: the program makes executors one after another, and the
        next forks all of its own. Other programs (processes the user starts, often several
        at once) all fork, and so does every worker when modules are to be preloaded
        (`ENV_PRELOAD`): each then starts with them."""
        preload = os.environ.get(ENV_PRELOAD, "")
        if program != WORKER_PROGRAM or preload.strip(" ,"):
            return False
        if shared_launchers.running(self.python, preload, self.flags, threads):
            return False
        with self._lock:
            first = self._fresh < FRESH_FIRST and thread_key(threads) not in self._launchers
            self._fresh += first
            ahead = first and self._fresh == 1 and _STARTED[0] > 0
            _STARTED[0] += first and self._fresh == 1
        if ahead:
            with contextlib.suppress(LauncherError, PermanentBackendError):
                self._the_launcher(threads)
        return first

    def _fork_worker(self, spec: WorkerSpec, env: dict[str, str], program: str,
                     closes: int, threads: dict[str, str]) -> WorkerHandle:
        log = None
        if self.capture_output:
            log = str(self._log_path(spec.worker_id))
        launcher = self._the_launcher(threads)
        try:
            proc = launcher.spawn(env=env, cwd=spec.workdir or os.getcwd(), memory=None,
                                  log=log, program=program, group=_group_of(program),
                                  on_exit=self._fork_exited)
        except LauncherError:
            if self._replaced(launcher, threads):
                return self._fork_worker(spec, env, program, closes, threads)
            raise
        with self._lock:
            overtaken = self._closes != closes
            key = _key(spec.worker_id, proc.pid)
            if not overtaken:
                self._procs[key] = proc
                self._forked[proc.pid] = key
        if overtaken:  # closed while it forked: the launcher lives on, the worker goes
            proc.kill()
            proc.wait(timeout=10)
            raise LauncherError("the backend was closed while the worker was forked")
        if proc.poll() is not None:  # exited before it was recorded: report it now
            self._exited(key)
        return WorkerHandle(spec.worker_id, str(proc.pid))

    def _the_launcher(self, threads: dict[str, str]) -> Launcher:
        """The program's launcher (`SharedLaunchers`) for workers with ``threads``, started
        if need be."""
        key = thread_key(threads)
        with self._lock:
            launcher = self._launchers.get(key)
            if launcher is None:
                env = {**os.environ, ENV_EXECUTOR_PID: _executor_pid(), **threads}
                try:
                    launcher = self._launchers[key] = shared_launchers.get(
                        self.python, env, self.flags)
                except FileNotFoundError as exc:
                    raise PermanentBackendError(
                        f"cannot start the worker launcher: {self.python!r} not found; "
                        "pass python= to LocalBackend") from exc
            return launcher

    def _replaced(self, launcher: Launcher, threads: dict[str, str]) -> bool:
        """Whether a fork that ``launcher`` failed may be asked of a new one: it forked
        workers, then its process ended (killed, say), and fewer than `LAUNCHER_RESTARTS`
        were replaced; or another start has replaced it already. Its children live on."""
        if not launcher.gone:
            return False  # alive: it failed this fork (or never answered), no replacement
        try:  # its socket closes as it exits, a moment before its status can be read
            code = launcher.proc.wait(timeout=LAUNCHER_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            code = None  # its socket closed, yet it runs on: not replaced
        key = thread_key(threads)
        with self._lock:
            current = self._launchers.get(key)
            if current is not launcher:  # replaced already (or the backend closed)
                return current is not None
            if code is None or not launcher.forked or self._restarts >= LAUNCHER_RESTARTS:
                return False
            del self._launchers[key]
            self._restarts += 1
            restarts = self._restarts
        shared_launchers.retire(launcher)
        ended = WorkerStatus(WorkerState.EXITED, exit_code=code).describe()
        log.warning("the worker launcher (pid %d) %s after it forked %d process(es); a new "
                    "one forks the next (replacement %d of %d)", launcher.proc.pid, ended,
                    launcher.forked, restarts, LAUNCHER_RESTARTS)
        return True

    def _fork_exited(self, proc: ForkedProcess) -> None:
        with self._lock:
            key = self._forked.pop(proc.pid, None)
        if key is not None:
            self._exited(key)

    def _exit_status(self, key: str, code: int) -> WorkerStatus:
        """An exit; a failure under a memory limit says what may be why (an allocation
        refused there ends the interpreter with its error status, or a crash in native code
        that did not check for one)."""
        memory = self._memory.get(key)
        if code == 0 or memory is None or -code in _STOPPED_BY_SOMEONE:
            return WorkerStatus(WorkerState.EXITED, exit_code=code)
        return WorkerStatus(WorkerState.EXITED, exit_code=code, reason=(
            f"its address space was limited to memory={memory} bytes (RLIMIT_AS); if its "
            "output shows a MemoryError, or it ended before connecting, the interpreter, its "
            "imports or the task need more, so raise memory="))

    def _output(self, worker_id: str) -> int | None:
        if not self.capture_output:
            return None
        return os.open(self._log_path(worker_id), os.O_WRONLY | os.O_CREAT, 0o600)

    def _log_path(self, worker_id: str) -> Path:
        if self._logdir is None:
            self._logdir = Path(tempfile.mkdtemp(prefix="fiberexec-logs-"))
        return self._logdir / f"{worker_id}.log"

    def _proc_of(self, handle: WorkerHandle
                  ) -> tuple[str, subprocess.Popen[bytes] | ForkedProcess | None]:
        """(Holding the lock.) The key and process ``handle`` names (by its pid; a handle
        with none: the first of its worker id)."""
        if handle.ref:
            key = _key(handle.worker_id, handle.ref)
            return key, self._procs.get(key)
        key = next((k for k in self._procs if k.partition(" ")[0] == handle.worker_id), "")
        return key, self._procs.get(key)

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        with self._lock:
            key, proc = self._proc_of(handle)
        if proc is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
        code = proc.poll()
        if code is None:
            return WorkerStatus(WorkerState.RUNNING)
        return self._exit_status(key, code)

    def stop(self, handle: WorkerHandle, *, grace: float = 2.0) -> None:
        self.unwatch(handle)
        with self._lock:
            key, proc = self._proc_of(handle)
            if proc is not None:
                del self._procs[key]
                self._memory.pop(key, None)
                self._forked.pop(proc.pid, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.kill()
        proc.wait(timeout=10)  # reap: no zombie survives stop()

    def signal(self, handle: WorkerHandle, sig: int) -> None:
        """Send ``sig`` to the worker process (nothing if it already exited)."""
        with self._lock:
            _, proc = self._proc_of(handle)
        if proc is not None:
            proc.send_signal(sig)  # a no-op once the process was reaped

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        if self._logdir is None:
            return ""
        path = self._logdir / f"{handle.worker_id}.log"
        if not path.exists():
            return ""
        with path.open(errors="replace") as f:
            return "".join(deque(f, maxlen=tail))

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        with self._lock:
            key, proc = self._proc_of(handle)
        if proc is None:
            listener(handle, self.status(handle))
            return
        self._exit_watch.watch(handle, listener)
        code = proc.poll()  # it may have exited before it was registered
        if code is not None:
            self._exit_watch.report(handle, self._exit_status(key, code))

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    def _exited(self, key: str) -> None:
        """The reaper (or the launcher) saw the process of ``key`` exit; report it to its
        listener, if any (once). Never waits (a reader of exits that did would hold up
        every other's)."""
        with self._lock:
            proc = self._procs.get(key)
        code = None if proc is None else proc.poll()  # (reaps an exited child)
        if proc is not None and code is None:
            # It has exited (its pidfd said so), but another thread is reading its status
            # this moment (`Popen.poll` then answers None): that ends at once.
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=EXIT_READ_WAIT)
        if proc is not None and code is not None:
            worker_id, _, pid = key.partition(" ")
            self._exit_watch.report(WorkerHandle(worker_id, pid), self._exit_status(key, code))

    def close(self) -> None:
        with self._lock:
            self._closes += 1
            keys = list(self._procs)
        for key in keys:
            worker_id, _, pid = key.partition(" ")
            self.stop(WorkerHandle(worker_id, pid), grace=1.0)
        for handle in self._exit_watch.clear():
            self.stop(handle, grace=0.5)
        self._reaper.close()
        with self._lock:
            self._launchers.clear()  # the program's: they stay for the next (`SharedLaunchers`)
        if self._logdir is not None:
            shutil.rmtree(self._logdir, ignore_errors=True)

    # -- capabilities of the ``fiberexec`` command ---------------------------------------------

    @classmethod
    def launch_master(cls, request: MasterRequest) -> int:
        """Run the program as a child process with the master's environment; its status.
        SIGTERM, SIGHUP and SIGQUIT sent to this process are passed on to it (as a shell's
        ``exec`` would have it get them), so it is never left running on its own."""
        env = {**os.environ, **request.master_env(os.environ)}
        try:
            proc = subprocess.Popen(request.command, env=env)
        except FileNotFoundError:
            raise ConfigurationError(
                f"cannot run {request.command[0]!r}: no such program") from None
        passed_on = _pass_signals_on(proc)
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the child got the terminal's SIGINT too: let it finish up
            proc.send_signal(signal.SIGINT)
            return proc.wait()
        finally:
            for sig, handler in passed_on.items():
                signal.signal(sig, handler)

    @classmethod
    def probe(cls) -> Probe:
        return Probe(cls.name, True, f"{platform.python_implementation()} "
                                     f"{platform.python_version()}, {os.cpu_count()} CPUs")

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """Stop the worker processes of this machine ``sweep`` picks (by default those whose
        executor process is gone)."""
        return remove_stray_local(sweep)
