"""Workers on other machines over SSH: one ``ssh`` session per host, forking its workers.

::

    start_worker(spec) --place--> host with a free slot (least loaded; recently failed hosts
         |                        last) --> that host's session, opened on its first worker:
         |                        ssh host 'exec python -c LOADER fiberexec-ssh-host EXECUTOR'
         |                          the host wrapper: one launcher (python -m fiberexec.worker
         |                          --launcher) forks the host's workers
         +-- stdin: a framed spawn request (env + secret, argv, workdir, limits)
         +-- waits for "spawned n pid" (the host session: `_ssh_session.HostSession`)
    the session's reader thread: "#fiberexec-out n line" -> worker n's logs(); "exit n code"
         and the end of the session -> the watch listener
    stop(handle):  "signal n term" -> grace -> "signal n kill" -> no answer: cut the session
    the last worker gone (or close()): the session's stdin closes, the wrapper leaves
    remove_stray:  ssh into every host, signal workers the backend started there

The host's workers are forked by one launcher that imported the worker program once
(`fiberexec.backend.Launcher`), so hundreds of workers on a host cost one ssh session and
one interpreter start, not hundreds. A worker with ``cpu``/``memory`` limits, and a command
that is not one of fiberexec's ``python -m fiberexec...`` programs, is started by the host
wrapper itself (``systemd-run --user --scope`` for limits: a scope of its own, which a fork
cannot join), inside the same session.

Why the system ``ssh`` client rather than a library (asyncssh, paramiko): it is on every
machine that has SSH at all, adds no dependency and no cryptography to this process, and it
honours everything users already configured (``~/.ssh/config`` aliases, ``ProxyJump``
bastions, agents and hardware keys, ``known_hosts``, Kerberos, ``ControlMaster``). Errors are
read from its exit code (255) and its messages in one place (`_ssh_session.classify`).

Guarantees:

- The executor's secret (``spec.secret_env``) travels only inside the SSH channel, in the
  spawn request on the host wrapper's stdin (and from there over a private socket pair to
  the launcher): never on a command line, never in a file. A forked worker's
  ``/proc/<pid>/environ`` is its launcher's, which holds no secret.
- A worker dies with its host's session: when the executor closes the session or dies, the
  host wrapper reads end of input and terminates every worker of the host (SIGKILL after a
  grace period). The backend pings every wrapper each second over its session; when the
  network between them fails, a wrapper that hears nothing for ``silence_timeout`` (at
  least three pings) plus two seconds terminates its workers, even ones busy in long tasks
  (an idle worker already leaves by itself after ``silence_timeout`` of silence).
- A worker that ends on the host is reported with its exit code (a negative one for a
  signal) and its siblings run on; when the session ends, every worker of the host is
  reported gone, with ssh's last message as the reason.
- ``cpu``/``memory`` are enforced with ``systemd-run --user --scope -p CPUQuota= -p
  MemoryMax=`` on hosts where that works; elsewhere the worker runs unlimited and the backend
  logs a warning saying so (once per host). ``gpu`` is not managed by this backend.

A host needs: an ``sshd`` that accepts your key non-interactively (``BatchMode``), a POSIX
login shell, Linux 5.3 or later (``/proc`` for `remove_stray`, pidfds for the launcher), a
Python 3.11 with the executor's version of fiberexec and your code's dependencies installed
(``python=`` per host), and a route to the executor's address.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from fiberexec.backend import (
    ENV_PRELOAD,
    Backend,
    BackendError,
    ConfigurationError,
    ExitListener,
    ExitWatch,
    PermanentBackendError,
    RetryPolicy,
    Sweep,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    configured_backend_options,
    names_to_teach,
)
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends._ssh_hosts import Placement, SSHHost, parse_hosts, read_inventory
from fiberexec.backends._ssh_session import (
    HostSession,
    Remote,
    classify,
    frame,
    remote_command,
)

__all__ = ["SSHBackend", "SSHHost", "remove_stray"]

log = logging.getLogger("fiberexec.ssh")
HostEntry = str | Mapping[str, Any] | SSHHost
KEPT_SESSIONS = 1024  # stopped workers whose output logs() still returns
PING_INTERVAL = 1.0  # seconds between pings to every remote wrapper
SYNC_TIMEOUT = 5.0  # seconds logs() waits for output the worker wrote before the call
WATCHDOG_SLACK = 2.0  # seconds a wrapper waits beyond three missed pings or heartbeats
STRAY_RETRY = RetryPolicy(attempts=3, deadline=30.0)  # per host, for transient ssh errors
ENV_HEARTBEAT = "FIBEREXEC_HEARTBEAT"  # the worker's heartbeat, also the wrappers' pace
ENV_SILENCE = "FIBEREXEC_SILENCE"  # seconds of the executor's silence a worker waits out


class SSHBackend(Backend):
    """Run workers on hosts you can reach with ``ssh``.

    Args:
        hosts: ``["user@h1", "user@h2", {"host": "user@h3", "slots": 8, "python": ...}]``
            (see `fiberexec.backends._ssh_hosts` for the fields).
        inventory: a file listing hosts instead (TOML or one host per line).
        python: the interpreter on hosts that name none (it must import fiberexec).
        slots: how many workers a host that names no ``slots`` takes (default: no limit).
        ssh: the ssh client program.
        ssh_config, identity_file, known_hosts: passed to ssh as ``-F``, ``-i`` and
            ``UserKnownHostsFile`` (default: your own ssh configuration).
        ssh_options: more ssh arguments, e.g. ``["-o", "ProxyJump=gate"]``.
        connect_timeout: seconds ssh may take to connect (``ConnectTimeout``).
        start_timeout: seconds from running ssh to the worker being spawned on the host.
        server_alive: seconds between ssh keepalives (``ServerAliveInterval``; 3 missed end
            the session).
        bind_host, advertise_host: where the executor listens and what workers dial
            (default: this machine's address on the route to the first host).
        cooldown: seconds a host that failed is used only when no other host has room.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping a worker.

    A worker's `WorkerHandle.ref` is ``"<host>#<pid on that host>"``; `placements` lists them.

    Example:
        >>> from fiberexec import FiberExecutor
        >>> hosts = ["me@node1", {"host": "me@node2", "slots": 4}]
        >>> with FiberExecutor(8, backend="ssh",  # doctest: +SKIP
        ...                    backend_options={"hosts": hosts}) as ex:
        ...     ex.submit(abs, -1).result()
        1
    """

    name = "ssh"
    #: cpu/memory only on hosts where systemd-run works (others are warned about), gpu never.
    enforces_resources = True  # where systemd-run can't, the backend warns per host itself
    resource_limits: ClassVar[Mapping[str, str]] = {
        "cpu": "systemd-run CPUQuota= on hosts where systemd-run --user works",
        "memory": "systemd-run MemoryMax= on hosts where systemd-run --user works",
    }

    def __init__(
        self,
        hosts: Iterable[HostEntry] | None = None,
        *,
        inventory: str | os.PathLike[str] | None = None,
        python: str = "python3",
        slots: int | None = None,
        ssh: str = "ssh",
        ssh_config: str | os.PathLike[str] | None = None,
        identity_file: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        ssh_options: Sequence[str] = (),
        connect_timeout: float = 10.0,
        start_timeout: float = 60.0,
        server_alive: float = 5.0,
        bind_host: str | None = None,
        advertise_host: str | None = None,
        cooldown: float = 30.0,
        stop_grace: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for key, value in (("connect_timeout", connect_timeout), ("start_timeout", start_timeout),
                           ("server_alive", server_alive)):
            if value <= 0:
                raise ConfigurationError(f"{key} must be > 0 seconds, got {value}")
        if stop_grace < 0 or cooldown < 0:
            raise ConfigurationError(
                f"stop_grace and cooldown must be >= 0 seconds, got {stop_grace}, {cooldown}")
        parsed = self._hosts(hosts, inventory, python, slots)
        self.placement = Placement(parsed, cooldown=cooldown, clock=clock)
        self.ssh = ssh
        self.ssh_config = str(ssh_config) if ssh_config else None
        self.identity_file = str(identity_file) if identity_file else None
        self.known_hosts = str(known_hosts) if known_hosts else None
        self.ssh_options = tuple(ssh_options)
        self.connect_timeout = connect_timeout
        self.start_timeout = start_timeout
        self.server_alive = server_alive
        self.stop_grace = stop_grace
        self._bind = bind_host
        self._advertise = advertise_host
        self._host_sessions: dict[str, HostSession] = {}  # host label -> its open session
        self._workers: dict[str, Remote] = {}
        self._finished: OrderedDict[str, Remote] = OrderedDict()  # stopped: kept for logs()
        self._noted: set[str] = set()
        self._pinger: threading.Thread | None = None
        self._closed = threading.Event()
        self._exit_watch = ExitWatch()
        self._lock = threading.Lock()

    @staticmethod
    def _hosts(hosts: Iterable[HostEntry] | None, inventory: str | os.PathLike[str] | None,
               python: str, slots: int | None) -> list[SSHHost]:
        if isinstance(hosts, str):
            hosts = [hosts]
        if (hosts is None) == (inventory is None):
            raise ConfigurationError(
                "the ssh backend needs hosts= (a list like ['user@h1', 'user@h2']) or "
                "inventory= (a file), exactly one of them; e.g. "
                "backend_options={'hosts': ['me@node1']}")
        if hosts is not None:
            parsed = parse_hosts(hosts, python=python, slots=slots)
        else:
            assert inventory is not None
            parsed = read_inventory(inventory, python=python, slots=slots)
        if not parsed:
            raise ConfigurationError("the ssh backend needs at least one host, got none")
        return parsed

    # ------------------------------------------------------------ addresses

    @property
    def advertise_host(self) -> str:
        """The address workers dial: given, or this machine's source address toward the
        first host (found from the routing table; nothing is sent)."""
        with self._lock:
            if self._advertise is None:
                self._advertise = self._route_source(self.placement.hosts()[0])
            return self._advertise

    @advertise_host.setter
    def advertise_host(self, value: str) -> None:
        self._advertise = value

    @property
    def bind_host(self) -> str:
        return self._bind or self.advertise_host

    @bind_host.setter
    def bind_host(self, value: str) -> None:
        self._bind = value

    def _route_source(self, host: SSHHost) -> str:
        name, port = self._resolve_name(host)
        try:
            family, _, _, _, address = socket.getaddrinfo(name, port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(address)  # UDP connect only consults the routing table
                return str(probe.getsockname()[0])
        except OSError as exc:
            raise ConfigurationError(
                f"cannot tell which address of this machine ssh host {host.label} reaches "
                f"({name}: {exc}); pass advertise_host= (and bind_host=) to SSHBackend") from exc

    def _resolve_name(self, host: SSHHost) -> tuple[str, int]:
        """The host name and port ssh would connect to (``ssh -G``: aliases, HostName)."""
        try:
            out = subprocess.run([*self._ssh_argv(host), "-G", host.target], capture_output=True,
                                 text=True, timeout=15, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        settings = dict(line.partition(" ")[::2] for line in out.splitlines())
        name = settings.get("hostname") or host.target.rpartition("@")[2]
        port = settings.get("port", "")
        return name, int(port) if port.isdigit() else (host.port or 22)

    # ------------------------------------------------------------ ssh

    def _ssh_argv(self, host: SSHHost) -> list[str]:
        argv = [self.ssh, "-T", "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
                "-o", f"ServerAliveInterval={max(1, round(self.server_alive))}",
                "-o", "ServerAliveCountMax=3"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        if self.identity_file:
            argv += ["-i", self.identity_file, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if host.port:
            argv += ["-p", str(host.port)]
        return [*argv, *self.ssh_options, *host.ssh_options]

    def command_for(self, host: SSHHost, *marks: str) -> list[str]:
        """The full ssh command line that runs the remote wrapper on ``host``."""
        return [*self._ssh_argv(host), "--", host.target, remote_command(host.python, *marks)]

    # ------------------------------------------------------------ the seam

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        host = self.placement.reserve(spec.worker_id)
        with self._lock:
            session = None if self._closed.is_set() else self._session_for(host, spec)
        try:
            if session is None:
                raise PermanentBackendError(
                    f"cannot start worker {spec.worker_id}: the ssh backend was closed; "
                    "create a new SSHBackend")
            session.open(spec.worker_id, self.connect_timeout + self.start_timeout)
            worker = session.spawn(spec.worker_id, self._message(spec, session),
                                   self.start_timeout)
        except BaseException:
            self.placement.release(spec.worker_id)
            self.placement.suspect(host)
            if session is not None:
                self._release(session)
            raise
        worker.on_exit(lambda _status: self._release(session))
        with self._lock:
            self._workers[spec.worker_id] = worker
            if self._pinger is None:
                self._pinger = threading.Thread(target=self._ping_loop,
                                                name="fiberexec-ssh-ping", daemon=True)
                self._pinger.start()
        self._note(host, worker.notes)
        return WorkerHandle(spec.worker_id, f"{host.label}#{worker.pid}")

    def _session_for(self, host: SSHHost, spec: WorkerSpec) -> HostSession:
        """The host's session (a new one if it has none, or it ended), counting one more
        worker on it. Called with the lock held."""
        session = self._host_sessions.get(host.label)
        if session is None or session.ended:
            session = HostSession(host, self.command_for(host, remote.HOST_MARK,
                                                         spec.executor_id), self._hello(spec))
            self._host_sessions[host.label] = session
        session.users += 1
        return session

    def _release(self, session: HostSession) -> None:
        """One worker fewer on the session's host: the last one closes the session."""
        with self._lock:
            session.users -= 1
            idle = session.users == 0
            if idle and self._host_sessions.get(session.host.label) is session:
                del self._host_sessions[session.host.label]
        if idle:
            session.close()

    def _hello(self, spec: WorkerSpec) -> dict[str, Any]:
        try:
            silence = float(spec.env.get(ENV_SILENCE, "30"))
        except ValueError:
            silence = 30.0
        return {"action": "host", "executor_id": spec.executor_id, "grace": self.stop_grace,
                "watchdog": max(silence, 3 * PING_INTERVAL) + WATCHDOG_SLACK,
                # the modules this process's launcher preloads, the host's launcher does too
                "preload": os.environ.get(ENV_PRELOAD, "")}

    @staticmethod
    def _message(spec: WorkerSpec, session: HostSession) -> dict[str, Any]:
        # ``learn``: the installed modules this program's tasks need (its first task's
        # function names them) that the host was not told of yet: its launcher imports
        # those installed there before it forks, as this host's launcher does (a hint: two
        # threads racing for the same names at worst tell the host twice)
        learn = names_to_teach(session.taught)
        return {"argv": list(spec.command), "env": dict(spec.env),
                "secret_env": dict(spec.secret_env), "workdir": spec.workdir,
                "cpu": spec.resources.cpu, "memory": spec.resources.memory, "learn": learn}

    def _ping_loop(self) -> None:
        """Tell every host wrapper we are here; one whose pings stop ends its workers."""
        while not self._closed.wait(PING_INTERVAL):
            with self._lock:
                sessions = list(self._host_sessions.values())
            for session in sessions:
                session.ping()

    def _note(self, host: SSHHost, notes: Sequence[str]) -> None:
        for note in notes:
            key = f"{host.label}: {note.split(':', 1)[0]}"
            with self._lock:
                fresh = key not in self._noted
                self._noted.add(key)
            if fresh:
                log.warning("fiberexec ssh: on host %s, %s", host.label, note)

    def status(self, handle: WorkerHandle) -> WorkerStatus:
        with self._lock:
            worker = self._workers.get(handle.worker_id) or self._finished.get(
                handle.worker_id)
        if worker is None:
            return WorkerStatus(WorkerState.UNKNOWN, reason="no such worker")
        return worker.current()

    def watch(self, handle: WorkerHandle, listener: ExitListener) -> None:
        worker = self._workers.get(handle.worker_id)
        if worker is None:
            listener(handle, self.status(handle))
            return
        self._exit_watch.watch(handle, listener)
        worker.on_exit(lambda status: self._ended(handle, status))

    def _ended(self, handle: WorkerHandle, status: WorkerStatus) -> None:
        self.placement.release(handle.worker_id)
        self._exit_watch.report(handle, status)

    def unwatch(self, handle: WorkerHandle) -> None:
        self._exit_watch.unwatch(handle)

    def stop(self, handle: WorkerHandle, *, grace: float | None = None) -> None:
        """SIGTERM the worker, SIGKILL it after ``grace``; an unreachable host's session is
        cut here (its workers exit by themselves once the executor falls silent)."""
        self.unwatch(handle)
        with self._lock:
            worker = self._workers.pop(handle.worker_id, None)
        if worker is None:
            return
        self._keep(handle.worker_id, worker)
        self.placement.stopping(worker.host, handle.worker_id)
        answered = worker.stop(self.stop_grace if grace is None else grace)
        self.placement.stopped(worker.host, answered=answered)
        if not answered:
            log.warning("fiberexec ssh: host %s did not answer while stopping worker %s; "
                        "closed its session", worker.host.label, handle.worker_id)

    def _keep(self, worker_id: str, worker: Remote) -> None:
        with self._lock:
            self._finished[worker_id] = worker
            while len(self._finished) > KEPT_SESSIONS:
                self._finished.popitem(last=False)

    def logs(self, handle: WorkerHandle, *, tail: int = 100) -> str:
        """The worker's last output lines (and ssh's own messages), also after it stopped;
        while it runs, everything it wrote before the call (waited for, up to
        `SYNC_TIMEOUT`: its output travels through ssh)."""
        with self._lock:
            running = self._workers.get(handle.worker_id)
            worker = running or self._finished.get(handle.worker_id)
        if running is not None:  # its output travels through ssh: let what it wrote arrive
            running.sync(SYNC_TIMEOUT)
        return worker.tail(tail) if worker else ""

    def placements(self) -> dict[str, tuple[str, int]]:
        """``{worker_id: (host, remote pid)}`` for every worker this backend runs."""
        with self._lock:
            workers = dict(self._workers)
        return {w: (r.host.label, r.pid) for w, r in workers.items()
                if r.pid is not None and not r.current().finished}

    def sessions(self) -> dict[str, int]:
        """``{host: pid of its local ssh client}`` for every host session open now."""
        with self._lock:
            return {label: s.client_pid for label, s in self._host_sessions.items()
                    if s.client_pid is not None and not s.ended}

    def close(self) -> None:
        """Stop every worker: each host's session closes, and its wrapper ends the host's
        workers (SIGTERM, SIGKILL after ``stop_grace``); a start still connecting is cut
        short (it raises)."""
        with self._lock:
            self._closed.set()
            sessions = list(self._host_sessions.values())
            workers, self._workers = self._workers, {}
        for worker_id, worker in workers.items():
            self.unwatch(WorkerHandle(worker_id, ""))
            self._keep(worker_id, worker)
            self.placement.stopping(worker.host, worker_id)
        if sessions:
            with ThreadPoolExecutor(min(16, len(sessions)), "fiberexec-ssh-stop") as pool:
                answers = dict(zip([s.host.label for s in sessions],
                                   pool.map(self._shut, sessions), strict=True))
            for worker in workers.values():
                self.placement.stopped(worker.host, answered=answers.get(worker.host.label,
                                                                         True))
        if self._pinger is not None:
            self._pinger.join(timeout=10)
        for handle in self._exit_watch.clear():
            self.stop(handle, grace=0.5)

    def _shut(self, session: HostSession) -> bool:
        if not session.greeted:  # ssh still connecting to a host that may never answer
            session.kill()
            return True
        return session.shutdown(self.stop_grace + remote.END_WAIT + SYNC_TIMEOUT)

    # ------------------------------------------------------------ strays

    @classmethod
    def remove_stray(cls, sweep: Sweep) -> list[str]:
        """``fiberexec cleanup``: stop the workers ``sweep`` picks on the configured hosts."""
        options = configured_backend_options("ssh")
        if not options.get("hosts") and not options.get("inventory"):
            raise ConfigurationError(
                "no ssh hosts are configured; set backend = \"ssh\" and backend_options "
                "hosts=[...] (or inventory=) in .fiberexec.toml or FIBEREXEC_BACKEND_OPTIONS"
            )
        return remove_stray(sweep=sweep, **options) or ["no stray workers"]

    def remove_workers(self, sweep: Sweep, *, grace: float = 3.0) -> list[str]:
        """Signal the workers ``sweep`` picks on every host (by default those whose wrapper,
        their executor's lease there, is gone); one line per process.

        Raises:
            TransientBackendError: some hosts could not be reached (the others were cleaned).
        """
        hosts = self.placement.hosts()
        with ThreadPoolExecutor(min(16, len(hosts)), "fiberexec-ssh-strays") as pool:
            outcomes = list(pool.map(lambda h: self._strays_on(h, sweep, grace), hosts))
        failed = [o for o in outcomes if isinstance(o, str)]
        if failed:
            raise TransientBackendError("cannot clean up on " + "; ".join(failed))
        return [line for o in outcomes if isinstance(o, list) for line in o]

    def _strays_on(self, host: SSHHost, sweep: Sweep, grace: float) -> list[str] | str:
        """Lines naming what was stopped on ``host``, or why it could not be cleaned."""
        try:
            return STRAY_RETRY.call(lambda: self._strays_once(host, sweep, grace))
        except BackendError as exc:
            return f"{host.label} ({exc})"

    def _strays_once(self, host: SSHHost, sweep: Sweep, grace: float) -> list[str]:
        message = {"code": _ssh_code(), "action": "strays", "executor_id": sweep.executor_id,
                   "everything": sweep.everything, "dry_run": sweep.dry_run, "grace": grace}
        try:
            done = subprocess.run(self.command_for(host, remote.CLEANUP_MARK),
                                  input=frame(message).decode(), capture_output=True,
                                  text=True, timeout=self.connect_timeout + grace + 30,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise TransientBackendError("no answer") from exc
        for line in done.stdout.splitlines():
            if line.startswith(remote.TAG):
                found = json.loads(line[len(remote.TAG):]).get("found", {})
                return [f"{sweep.verb()} {what} on {host.label} (pid {pid})"
                        for pid, what in found.items()]
        error = classify(host, done.returncode, done.stderr, None, "cleanup")
        raise type(error)(str(error).replace("cannot start worker cleanup", "cannot clean up"))


def _ssh_code() -> str:
    return Path(remote.__file__).read_text()


def remove_stray(executor_id: str | None = None, *, sweep: Sweep | None = None,
                 **options: Any) -> list[str]:
    """Stop workers the ssh backend started on the hosts ``options`` name (the
    `SSHBackend` arguments: ``hosts=`` or ``inventory=``, and how to reach them): those
    whose wrapper is gone, one executor's (``executor_id``), or those ``sweep`` picks.
    Return one line per process signalled.

    ``fiberexec cleanup --backend ssh`` calls this with the configured ``backend_options``.

    Example:
        >>> remove_stray(hosts=["me@node1", "me@node2"])  # doctest: +SKIP
        []
    """
    known = {"hosts", "inventory", "python", "slots", "ssh", "ssh_config", "identity_file",
             "known_hosts", "ssh_options", "connect_timeout"}
    backend = SSHBackend(**{k: v for k, v in options.items() if k in known})
    with contextlib.closing(backend):
        return backend.remove_workers(sweep or Sweep(executor_id=executor_id))
