"""`Process`: a job on any backend that runs ``run()`` (`multiprocessing.Process`).

    start()  -> broker keeps the pickled Process -> backend.start_worker(spec)
    child    -> python -m fiberexec.multiprocessing._process_main: dials the broker, proves
                it holds the secret (secret_env), fetches and unpickles the Process, runs it,
                exits 0, 1 (an exception, traceback on stderr) or the SystemExit code
    backend.watch -> exitcode set, sentinel readable, join() returns

A child exits when its parent's broker goes away, so no process outlives its parent. A
child's own children run beside it (``FIBEREXEC_BACKEND=local`` there: processes in its
container or pod), and it joins them before it exits, as the standard library's do.
"""

from __future__ import annotations

import atexit
import copy
import itertools
import os
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fiberexec import _imports, _syspath
from fiberexec._backend import (
    Backend,
    Resources,
    SignalNotSupportedError,
    WorkerHandle,
    WorkerSpec,
    WorkerStatus,
)
from fiberexec._errors import SerializationError
from fiberexec._serialize import dumps_bytes, pickler_error
from fiberexec.multiprocessing import _backends, _forward, _main, _timing
from fiberexec.multiprocessing._broker import get_broker

ENV_ADDRESS = _backends.ENV_PARENT_ADDRESS
ENV_PROCESS = "FIBEREXEC_MP_PROCESS"
ENV_SECRET = "FIBEREXEC_MP_SECRET"
ENV_AUTHKEY = "FIBEREXEC_MP_AUTHKEY"
ENV_PARENT = "FIBEREXEC_MP_PARENT"  # "<pid> <name>" of the parent
ENV_LOG = "FIBEREXEC_MP_LOG"  # "<level> <to stderr: 0|1>" of the stdlib's multiprocessing logger
# In a `Pool`'s worker: "<pid> <name>" of the process whose pool it is (see `_pool_worker`;
# set through the executor's ``env``, which keeps FIBEREXEC_* names for the executor's own)
ENV_POOL_PARENT = "_FIBER_POOL_PARENT"
POOL_WORKER = "SpawnPoolWorker"  # its name, as the stdlib's pools of spawned workers name theirs
COMMAND = ("python", "-m", "fiberexec.multiprocessing._process_main")
_counter = itertools.count(1)
_children: set[Process] = set()
_children_lock = threading.Lock()
_exit_hook = False


_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(name: str) -> str:
    """``name`` as a label value every backend takes (Kubernetes is the strictest: at most 63
    characters of letters, digits, ``-``, ``_`` and ``.``, first and last alphanumeric)."""
    return _NOT_IN_LABEL.sub("_", name)[:63].strip("._-")


class _Runtime:
    """Parent-side state of a started process (never pickled)."""

    def __init__(self, backend: Backend, proc_id: int, *, owns_backend: bool = False) -> None:
        self.backend = backend
        self.owns_backend = owns_backend  # made for this process alone: closed after it
        self.proc_id = proc_id
        self.handle: WorkerHandle | None = None
        self.exitcode: int | None = None
        self.done = threading.Event()
        self.sentinel_r, self.sentinel_w = os.pipe()
        self.signalled: int | None = None
        self.tickets: list[tuple[int, str]] = []  # pipe ends pickled into the payload
        self.keys: list[bytes] = []  # host pipe ends pickled into it (`_hostpipe`)
        self.collected: weakref.finalize[Any, Any] | None = None  # closes the sentinel
        # when the process object that holds this is collected

    # the standard library's ``Process._popen`` interface: code that calls
    # ``multiprocessing.Process.kill(p)`` or checks ``p._popen`` works on ours

    @property
    def pid(self) -> int | None:
        """The child's pid, once it reports it (waits up to `Timing.pid`)."""
        return get_broker().pid_of(self.proc_id, _timing.TIMING.pid, self.done.is_set)

    @property
    def returncode(self) -> int | None:
        return self.exitcode

    @property
    def sentinel(self) -> int:
        return self.sentinel_r

    def close_sentinel(self) -> None:
        """Close the parent's end of the sentinel pipe (once: the `Process`'s close, or its
        collection, whichever comes first)."""
        fd, self.sentinel_r = self.sentinel_r, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        """(A standard library process object's ``close``, see `Process._Popen`.)"""
        self.close_sentinel()

    def poll(self, flag: int = 0) -> int | None:
        return self.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exitcode

    def send_signal(self, sig: int) -> None:
        if self.done.is_set() or self.handle is None:
            return
        self.signalled = sig
        try:
            self.backend.signal(self.handle, sig)
        except SignalNotSupportedError:  # the backend can only stop the job
            grace = _timing.TIMING.grace if sig == signal.SIGTERM else 0.0
            self.backend.stop(self.handle, grace=grace)
            self.finish(-sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def on_exit(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        """The backend saw the job end: clean up and record its exit code."""
        code = status.exit_code
        if code is None:
            code = -(self.signalled or signal.SIGKILL)
        elif self.signalled and code == 128 + self.signalled:
            code = -self.signalled  # a container runtime's way of saying "killed by"
        # Not on this (the backend's watch) thread: stopping may wait for that very watch.
        threading.Thread(target=_clean_up, args=(self, handle, code), daemon=True).start()

    def finish(self, code: int | None) -> None:
        if self.done.is_set():
            return
        broker = get_broker()
        broker.channels.drop_tickets(self.tickets)  # ends it never took: their readers see EOF
        broker.child_ended(self.proc_id)  # what it held here is released before join()
        if self.keys:
            from fiberexec.multiprocessing import _hostpipe

            _hostpipe.withdraw(self.keys)
        self.exitcode = code
        self.done.set()
        os.close(self.sentinel_w)
        with broker.fetched:  # a `pid` waiting for this child stops waiting
            broker.fetched.notify_all()


class Process:
    """A process started on a backend (default: local), with `multiprocessing.Process`'s API.

    Args:
        group: must be None (as in the standard library).
        target, args, kwargs: what `run` calls; subclasses may override `run` instead.
        name: default ``Process-N``.
        daemon: a daemon is terminated when its parent exits; others are joined first.
        backend: where to run (a name, `Backend` or factory; default: the default backend).

    The target's `meta` resources go into the job's spec. The process object is pickled
    (cloudpickle) into the child, so its attributes must be picklable.
    """

    def __init__(
        self,
        group: None = None,
        target: Callable[..., object] | None = None,
        name: str | None = None,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        daemon: bool | None = None,
        backend: _backends.BackendLike | None = None,
    ) -> None:
        if group is not None:
            raise AssertionError("group argument must be None for now")
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        # as the stdlib's: each process counts, named or not; a child's count follows its own
        self._identity: tuple[int, ...] = (*current_process()._identity, next(_counter))
        self._name = name or f"{type(self).__name__}-{':'.join(map(str, self._identity))}"
        self._daemon = bool(daemon) if daemon is not None else current_process().daemon
        self._authkey = current_process().authkey
        self._backend_choice = backend
        self._fx: _Runtime | None = None
        self._closed = False
        self._child_pid: int | None = None  # set in the child

    # ------------------------------------------------------------ what the child runs

    def run(self) -> None:
        """Call the target; override in subclasses."""
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fx"] = None
        state["_backend_choice"] = None
        state["_authkey"] = b""  # travels as a secret (`ENV_AUTHKEY`), never in a pickle
        return state

    # ------------------------------------------------------------ parent side

    def start(self) -> None:
        """Start the process on its backend."""
        if self._closed:
            raise ValueError("process object is closed")
        if self._fx is not None:
            raise AssertionError("cannot start a process twice")
        if self._child_pid is not None:
            raise AssertionError("can only start a process object created by current process")
        if current_process().daemon:
            raise AssertionError("daemonic processes are not allowed to have children")
        _main.check_not_importing()
        active_children()  # (as the stdlib's start: children that ended are forgotten)
        choice = self._backend_choice
        backend = _backends.shared_backend() if choice is None else _backends.new_backend(choice)
        broker = get_broker()
        _install_exit_hook()
        from fiberexec.multiprocessing import _connection, _hostpipe

        tickets, keys = _connection.capture_tickets(), _hostpipe.capture_keys()
        try:
            payload = dumps_bytes(self, what="process", spawning=True)
        except SerializationError as exc:  # what the pickler raised, as the stdlib's start
            error = pickler_error(exc)
            if error is exc:
                raise
            raise error from None
        finally:
            _connection.stop_capture()
            _hostpipe.stop_capture()
        runtime = _Runtime(backend, broker.add_process(payload),
                           owns_backend=choice is not None and not isinstance(choice, Backend))
        runtime.tickets = [(cid, t) for address, cid, t in tickets if address == broker.address]
        runtime.keys = keys
        spec = self._spec(broker.address, broker.secret, runtime.proc_id,
                          forward=not backend.workers_share_host)
        _backends.note_unenforced(backend, spec.resources)
        # what the child imports to load what it runs, the launcher may import once first
        _imports.learn_from(self._target if self._target is not None else type(self).run)
        runtime.handle = backend.start_worker(spec)
        self._fx = runtime
        # As the stdlib's: a process object dropped without `close` gives its descriptor
        # back (a loop starting environments anew ran out of them). Not at exit: the
        # stdlib's exit function, which runs after weakref's, still waits on the sentinels
        # of live processes (a stdlib `Pool` given this context does).
        runtime.collected = weakref.finalize(self, runtime.close_sentinel)
        runtime.collected.atexit = False
        # as the stdlib: the parent lets go of what the child runs (a target that refers
        # to the process object would otherwise keep both alive)
        del self._target, self._args, self._kwargs
        with _children_lock:
            _children.add(self)
        # the listener holds the runtime, not the process object: a joined and dropped
        # process is collectable at once, while the backend's watch thread unwinds
        backend.watch(runtime.handle, runtime.on_exit)

    @staticmethod
    def _Popen(process_obj: Any) -> _Runtime:  # (the standard library's name)
        """Start a standard library ``multiprocessing.Process`` as one of these: what its
        ``start()`` calls under ``multiprocessing.set_start_method("fiber")`` (see
        `fiberexec._start_method`). A `Process` named after it runs its ``run()``; what is
        returned is what it keeps as ``_popen`` (its ``join``, ``exitcode``, ``terminate``,
        ``kill``, ``sentinel`` and ``close`` work through it). The stand-in stays among
        this process's children, so it is joined (or, daemonic, terminated) at exit."""
        _imports.learn_from(getattr(process_obj, "_target", None) or type(process_obj).run)
        stand_in = Process(target=_run_stdlib_process, args=(_shipped(process_obj),),
                           name=process_obj.name, daemon=process_obj.daemon)
        stand_in.start()
        runtime = stand_in._runtime()
        if runtime.collected is not None:  # the sentinel lives as long as their object
            runtime.collected.detach()
        runtime.collected = weakref.finalize(process_obj, runtime.close_sentinel)
        runtime.collected.atexit = False
        return runtime

    def _spec(self, address: str, secret: bytes, proc_id: int, *, forward: bool
              ) -> WorkerSpec:
        """The child's job; ``forward``: it sends its output here (`_forward`), where
        nobody would see it otherwise (workers not on this host)."""
        hint = _backends.meta_of(self._target) or _backends.meta_of(type(self).run)
        resources = hint.resources() if hint else Resources()
        return WorkerSpec(
            worker_id=f"mp-{os.getpid()}-{proc_id}",
            executor_id=f"mp{os.getpid()}",
            command=COMMAND,
            # a child's own children run beside it, on the local backend, whatever the
            # configuration there says (its options are for this process's backend)
            env={ENV_ADDRESS: address, ENV_PROCESS: str(proc_id), "FIBEREXEC_BACKEND": "local",
                 "FIBEREXEC_BACKEND_OPTIONS": "{}",
                 ENV_PARENT: f"{os.getpid()} {current_process().name}",
                 _syspath.ENV_SYS_PATH: _syspath.export(), **_logging_env(),
                 **({_forward.ENV_OUTPUT: "forward"} if forward else {})},
            secret_env={ENV_SECRET: secret.hex(), ENV_AUTHKEY: self._authkey.hex()},
            image=_backends.configuration().image,
            workdir=os.getcwd(),
            script_dir=_syspath.script_dir(),
            resources=resources,
            labels={"fiberexec.process": label_value(self._name)},
        )

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    @property
    def _popen(self) -> _Runtime | None:
        """None until started (code written for the stdlib tests this)."""
        return self._fx

    def _runtime(self) -> _Runtime:
        self._check_closed()
        if self._fx is None:
            raise AssertionError("can only use a started process")
        return self._fx

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process ends, or ``timeout`` seconds pass."""
        if self._closed:
            raise ValueError("process object is closed")
        if self._fx is None:
            raise AssertionError("can only join a started process")
        if self._fx.done.wait(timeout):
            with _children_lock:
                _children.discard(self)

    def is_alive(self) -> bool:
        if self._child_pid is not None and self._child_pid == os.getpid():
            return True
        if self._closed:
            raise ValueError("process object is closed")
        fx = self._fx
        if fx is None or fx.done.is_set():
            return False
        if fx.signalled is not None and self._child_pid is None:
            # told to end before it said its pid (a container still starting): alive once it
            # has, else not, for code written for the stdlib reads the pid of a live process
            # (its pool's terminate does); waits for one or the other, up to `Timing.pid`
            _ = fx.pid
        if fx.done.is_set():
            return False
        os.sched_yield()  # (as `exitcode`: a loop on it lets the process's other threads run)
        return True

    @property
    def exitcode(self) -> int | None:
        """None while running; the exit code, or minus the signal that ended it.

        While the child runs, reading it lets this process's other threads run, as the
        standard library's does (its ``waitpid``): the standard library's `Pool` reads it
        in a loop that turns while results wait to be read, and with the interpreter's lock
        kept there, its result thread waited out the switch interval for each result (maps
        on it ran 2-10x slower than on its own processes, measured)."""
        if self._closed:
            raise ValueError("process object is closed")
        fx = self._fx
        if fx is None:
            return None
        code = fx.exitcode
        if code is None:
            os.sched_yield()  # (lets go of the interpreter's lock, as a system call does)
        return code

    def _signal(self, sig: int) -> None:
        self._runtime().send_signal(sig)

    def terminate(self) -> None:
        """Send SIGTERM; `exitcode` becomes ``-SIGTERM`` (see `Backend.signal`)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL; `exitcode` becomes ``-SIGKILL``."""
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Release the process object's resources; ValueError if it still runs."""
        if self._closed:
            return
        if self._fx is not None:
            if not self._fx.done.is_set():
                raise ValueError("Cannot close a process while it is still running. "
                                 "You should first call join() or terminate().")
            self._fx.close_sentinel()
        self._closed = True

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends; ValueError
        before `start`, as in the stdlib."""
        self._check_closed()
        if self._fx is None:
            raise ValueError("process not started")
        return self._fx.sentinel

    @property
    def pid(self) -> int | None:
        """The child's pid as the child sees it (in a container: its own pid namespace).

        Known once the child has started; a started child's pid waits up to `Timing.pid`.
        """
        self._check_closed()
        if self._child_pid is not None:
            return self._child_pid
        return None if self._fx is None else self._fx.pid

    ident = pid

    @property
    def authkey(self) -> bytes:
        """The process's authentication key (a child gets its parent's, as in the stdlib)."""
        return self._authkey

    @authkey.setter
    def authkey(self, value: bytes) -> None:
        self._authkey = bytes(value)

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("name must be a string")
        self._name = value

    @property
    def daemon(self) -> bool:
        return self._daemon

    @daemon.setter
    def daemon(self, value: bool) -> None:
        if self._fx is not None:
            raise AssertionError("process has already started")
        self._daemon = bool(value)

    def __repr__(self) -> str:
        """As the stdlib's: ``<Process name='x' pid=12 parent=10 stopped exitcode=-SIGTERM>``
        (a pid not reported yet is not waited for)."""
        info = [type(self).__name__, f"name={self._name!r}"]
        fx = self._fx
        if self._closed:
            state = "closed"
        elif fx is None:
            state = "initial"
        else:
            pid = get_broker().pid_of(fx.proc_id, 0, fx.done.is_set)
            if pid is not None:
                info.append(f"pid={pid}")
            state = "stopped" if fx.done.is_set() else "started"
        info += [f"parent={os.getpid()}", state]
        if state == "stopped" and fx is not None and fx.exitcode is not None:
            code = fx.exitcode
            info.append(f"exitcode={_signal_name(code) if code < 0 else code}")
        if self._daemon:
            info.append("daemon")
        return f"<{' '.join(info)}>"


def _shipped(process_obj: Any) -> Any:
    """A copy of a standard library process object to pickle into the child, without its
    authentication key (a child gets it as a secret, `ENV_AUTHKEY`, never in a pickle)."""
    copied = copy.copy(process_obj)
    copied._config = {key: value for key, value in process_obj._config.items()
                      if key != "authkey"}
    return copied


def _run_stdlib_process(process_obj: Any) -> None:
    """In the child: run a standard library process object (`Process._Popen`)."""
    process_obj.run()


class SpawnProcess(Process):
    """``get_context("spawn").Process``: a `Process`, named ``SpawnProcess-N`` as the
    standard library's is (the method selects nothing else; see `_context`)."""


class ForkProcess(Process):
    """``get_context("fork").Process``, named ``ForkProcess-N``."""


class ForkServerProcess(Process):
    """``get_context("forkserver").Process``, named ``ForkServerProcess-N``."""


BY_METHOD: dict[str, type[Process]] = {
    "spawn": SpawnProcess, "fork": ForkProcess, "forkserver": ForkServerProcess,
    "fiber": Process}


class _MainProcess(Process):
    def __init__(self) -> None:
        import multiprocessing

        self._name, self._daemon, self._fx, self._closed = "MainProcess", False, None, False
        self._identity = ()
        self._child_pid = os.getpid()
        self._target, self._args, self._kwargs, self._backend_choice = None, (), {}, None
        self._authkey = bytes(multiprocessing.current_process().authkey)  # one key, as stdlib


class _ParentProcess:
    """The parent as seen from a child: alive until its broker connection is lost."""

    def __init__(self, pid: int, name: str, lost: threading.Event) -> None:
        self.pid = self.ident = pid
        self.name, self.daemon, self.exitcode = name, False, None
        self._lost = lost
        self._sentinel_r: int | None = None  # made when first asked for
        self._lock = threading.Lock()

    def is_alive(self) -> bool:
        return not self._lost.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._lost.wait(timeout)

    @property
    def sentinel(self) -> int:
        """A descriptor that becomes readable (end of file) once the parent is gone."""
        with self._lock:
            if self._sentinel_r is None:
                self._sentinel_r, sentinel_w = os.pipe()
                lost = self._lost

                def close_when_lost() -> None:
                    lost.wait()
                    os.close(sentinel_w)

                threading.Thread(target=close_when_lost, daemon=True,
                                 name="fiberexec-parent-sentinel").start()
            return self._sentinel_r

    def __repr__(self) -> str:
        return f"<_ParentProcess name={self.name!r} parent={self.pid} unknown>"


_current: Process | None = None
_parent: _ParentProcess | None = None


def current_process() -> Process:
    """The `Process` object of this process (``MainProcess`` where no Process started it;
    ``SpawnPoolWorker-N`` in a `Pool`'s worker)."""
    global _current
    if _current is None or (type(_current) is _MainProcess
                            and _current._child_pid != os.getpid()):  # forked: not ours
        _current = _pool_worker() or _MainProcess()
    return _current


def parent_process() -> _ParentProcess | None:
    """The parent of this process (name, pid, ``is_alive``, ``join``, ``sentinel``); None
    in the main process."""
    current_process()  # (a pool's worker learns it here)
    return _parent


def _pool_worker() -> Process | None:
    """In a `Pool`'s worker (an executor's worker the pool's settings mark): this process
    is ``SpawnPoolWorker-N``, a daemon, N its place in the pool counting from 1, with the
    pool's process for parent, for us and for the stdlib (``%(processName)s`` in logs, and
    ``current_process()._identity[0]``, which programs seed generators with), as in a
    stdlib pool's worker."""
    global _parent
    import multiprocessing.process

    from fiberexec._contract import ENV_WORKER_ID

    marked, worker = os.environ.get(ENV_POOL_PARENT), os.environ.get(ENV_WORKER_ID, "")
    if not marked or not worker[1:].isdigit():
        return None
    number = int(worker[1:]) + 1
    process = _MainProcess()
    process._name, process._identity, process._daemon = f"{POOL_WORKER}-{number}", (number,), True
    pid, _, name = marked.partition(" ")
    _parent = _ParentProcess(int(pid), name, threading.Event())  # gone: so is this worker
    ours = multiprocessing.current_process()
    ours.name, ours._identity = process.name, process._identity
    ours._config["daemon"] = True  # type: ignore[attr-defined]  # (so it starts no child)
    multiprocessing.process._parent_process = _parent  # type: ignore[attr-defined]
    return process


def active_children() -> list[Process]:
    """Children started here that are still running (finished ones are forgotten)."""
    with _children_lock:
        for child in list(_children):
            if child._fx is not None and child._fx.done.is_set():
                _children.discard(child)
        return list(_children)


def _logging_env() -> dict[str, str]:
    """The stdlib's multiprocessing logger, as its spawned children get it: its level,
    and whether it logs to stderr (`_process_main` sets both up)."""
    from multiprocessing import util

    if util._logger is None:  # type: ignore[attr-defined]
        return {}
    level = util._logger.getEffectiveLevel()  # type: ignore[attr-defined]
    return {ENV_LOG: f"{level} {int(bool(util._log_to_stderr))}"}  # type: ignore[attr-defined]


def _clean_up(runtime: _Runtime, handle: WorkerHandle, code: int) -> None:
    """Remove the ended job, then report the exit: join() returns with nothing left behind.

    A failed child's output is forwarded to our stderr first when it ran elsewhere (a local
    child writes to our stderr itself); removing a pod or container discards its logs.
    """
    backend = runtime.backend
    try:
        if code != 0:  # "" where the child wrote to our stderr itself (local processes)
            text = backend.logs(handle, tail=200)
            if text:
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
        backend.stop(handle, grace=_timing.TIMING.grace)
        if runtime.owns_backend:
            backend.close()  # and what it kept for later starts (the local launcher)
    except Exception as exc:
        print(f"fiberexec: could not clean up {handle.ref}: {exc}", file=sys.stderr)
    finally:
        runtime.finish(code)


def _install_exit_hook() -> None:
    global _exit_hook
    with _children_lock:
        if _exit_hook:
            return
        _exit_hook = True
    atexit.register(_exit_function, os.getpid())


def _exit_function(pid: int) -> None:
    """At exit, terminate daemonic children and join the others, as the stdlib does. Its
    exit function first runs the finalizers of priority 0 and up (a stdlib `Pool` given this
    context stops its threads and its workers there): they run here first too, since this
    hook, registered later, runs before the stdlib's."""
    if os.getpid() != pid:
        return
    from multiprocessing import util

    util._run_finalizers(0)  # type: ignore[attr-defined]  # (the stdlib's exit function's first step)
    join_children()


def join_children() -> None:
    for child in active_children():
        if child.daemon:
            child.terminate()
    for child in active_children():
        child.join()


def _signal_name(code: int) -> str:
    """``-SIGTERM`` for -15, as the stdlib's repr names a signal that ended a process."""
    try:
        return f"-{signal.Signals(-code).name}"
    except ValueError:
        return str(code)
