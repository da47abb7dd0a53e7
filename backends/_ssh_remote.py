"""What the ssh backend runs on a worker host, shipped over the SSH channel once per host.

The remote command is short and holds no secret::

    exec <python> -c '<LOADER>' fiberexec-ssh-host <executor id>

`LOADER` reads one length-prefixed JSON message from stdin (this module's source plus the
message) and runs it. Every later request on stdin is framed the same way
(`_ssh_session.frame`), so the secret in a spawn request travels only inside the encrypted
SSH channel, never on a command line or in a file. This module must stay importable by any
Python 3.8+ with the standard library only (it reports a host without fiberexec before it
imports any of it).

As a **host wrapper** (``action == "host"``) it checks that fiberexec is importable, says
``hello``, then serves the executor's requests until its stdin ends::

    stdin (framed JSON)                     the host wrapper            reports on stdout
    {"op": "spawn", "n", env, secret...} --> fiberexec.worker: forked by one launcher
                                             (python -m fiberexec.worker --launcher),
                                             other commands and limited workers: Popen
                                             each worker's output -> a pipe -> the pump
    {"op": "signal", "n", "sig"}         --> SIGTERM / SIGKILL that worker
    {"op": "sync", "k"}                  --> the pump reads every pipe dry  --> synced k
    {"op": "ping"}                           (proves the executor is there)
                                             the pump: "spawned n pid", each output line
                                             as OUT_TAG n line, "exit n code"

Workers are numbered ``n`` by the executor. The pump is the one thread that writes worker
output and spawned/exit reports, so a worker's output always precedes its exit report.
A worker that asks for ``cpu``/``memory`` starts under ``systemd-run --user --scope`` with
``CPUQuota=``/``MemoryMax=`` where the host can (a limit needs its own scope, which a fork of
the launcher cannot join), as does a command that is not one of fiberexec's programs; both are
started by this wrapper with Popen, inside the same session.

End of input (the SSH session closed, the executor died), SIGTERM/SIGHUP, or no request for
``watchdog`` seconds (the network failed, even while workers are deep in long tasks) ends
every worker of this host: SIGTERM, SIGKILL after the grace period; then the launcher exits.

As a **stray finder** (``action == "strays"``) it signals the workers the ssh backend started
in this host's network namespace that the message picks: by default those without a host
wrapper among their ancestors (a wrapper is its executor's lease here: it lives only while
the executor pings it), or one executor's workers and wrappers, or all of them; it reports
which it found.
"""

from __future__ import annotations

import json
import os
import queue
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

TAG = "#fiberexec-ssh "
OUT_TAG = "#fiberexec-out "  # OUT_TAG <n> <one line of worker n's output>
HOST_MARK = "fiberexec-ssh-host"  # argv[1] of every host wrapper: how ps and strays find them
CLEANUP_MARK = "fiberexec-ssh-cleanup"
ENV_MARK = "FIBEREXEC_SSH_WORKER"  # in every worker's (and launcher's) environment
EXIT_NO_FIBEREXEC = 3
END_WAIT = 5.0  # seconds for SIGKILLed workers to be reaped before the wrapper leaves anyway
FORKED = ("python", "-m", "fiberexec.")  # the programs the launcher forks
LOADER = """import os, json
def take(n):
    got = b''
    while len(got) < n:
        more = os.read(0, n - len(got))
        if not more:
            raise SystemExit(2)
        got += more
    return got
m = json.loads(take(int(take(10))))
code = compile(m.pop('code'), 'fiberexec-ssh', 'exec')
exec(code, {'__name__': '__fiberexec_ssh__', 'MESSAGE': m})
"""
_WRITE = threading.Lock()


def _write(data: bytes) -> None:
    """One whole line for the executor; a closed channel is not this process's problem."""
    with _WRITE:
        try:
            _write_all(data)
        except OSError:
            pass


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def say(**event: Any) -> None:
    _write((TAG + json.dumps(event) + "\n").encode())


# ------------------------------------------------------------------ limits


def _learn(names: Any) -> None:
    """Learn those of the modules ``names`` installed here, which this host's launchers
    import before their next fork (an older fiberexec here has no learn_names: its workers
    import them)."""
    if not names:
        return
    try:
        from fiberexec.backend import learn_names
    except ImportError:
        return
    learn_names(list(names))


def _thread_limits(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The numerical libraries' thread variables ``env`` sets, its worker's share applied
    (`fiberexec.backend.thread_limits`), as its launcher's key; none with an older
    fiberexec here."""
    try:
        from fiberexec.backend import thread_key, thread_limits
    except ImportError:
        return ()
    return thread_key(thread_limits(env))


def limits_prefix(cpu: float | None, memory: int | None) -> tuple[list[str], str]:
    """The ``systemd-run`` prefix that enforces the limits, or ``[]`` and why it cannot."""
    if cpu is None and memory is None:
        return [], ""
    wanted = " ".join(f"{k}={v}" for k, v in (("cpu", cpu), ("memory", memory)) if v)
    tool = _which("systemd-run")
    if tool is None:
        return [], f"{wanted} not enforced: systemd-run is not installed on this host"
    try:
        probe = subprocess.run([tool, "--user", "--scope", "--quiet", "true"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"{wanted} not enforced: systemd-run --user failed ({exc})"
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return [], f"{wanted} not enforced: systemd-run --user failed ({why[0]})"
    return systemd_run_argv(tool, cpu, memory), ""


def systemd_run_argv(tool: str, cpu: float | None, memory: int | None) -> list[str]:
    argv = [tool, "--user", "--scope", "--quiet", "--collect"]
    if cpu is not None:
        argv += ["-p", f"CPUQuota={round(cpu * 100)}%"]
    if memory is not None:
        argv += ["-p", f"MemoryMax={memory}", "-p", "MemorySwapMax=0"]
    return [*argv, "--"]


def _which(name: str) -> str | None:
    for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return None


def _fiberexec_missing() -> str:
    import importlib.util

    try:
        if importlib.util.find_spec("fiberexec.worker") is not None:
            return ""
        return "No module named 'fiberexec.worker'"
    except Exception as exc:  # ModuleNotFoundError, or a broken installation
        return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------ the host wrapper


class _Hangup(Exception):
    """SIGTERM or SIGHUP: end every worker, as at end of input."""


class Child:
    """One worker on this host, forked by the launcher or started with Popen."""

    def __init__(self, n: int, pid: int, send: Callable[[int], None],
                 wait: Callable[[], int] | None = None) -> None:
        self.n = n
        self.pid = pid
        self._send = send
        self.wait = wait  # a Popen'd worker's wait (a forked one's exit the launcher reports)
        self.done = threading.Event()  # its exit was reported

    def signal(self, sig: int) -> None:
        if not self.done.is_set():
            try:
                self._send(sig)
            except OSError:  # gone already (ProcessLookupError), or not ours to signal
                pass


class Pump:
    """The one thread that reports spawns and exits and forwards every worker's output,
    tagged with its number: a worker's output always precedes its exit report."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._todo: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._fds: dict[int, int] = {}  # worker number -> the read end of its output pipe
        self._partial: dict[int, bytes] = {}

    def post(self, *item: Any) -> None:
        self._todo.put(item)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pump has plenty of wake-ups pending already
            pass

    def run(self) -> None:
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    self._take_todo()
                else:
                    self._read(key.data)

    def _take_todo(self) -> None:
        try:
            os.read(self._wake_r, 65536)
        except BlockingIOError:
            pass
        while not self._todo.empty():
            item = self._todo.get()
            if item[0] == "add":
                self._add(*item[1:])
            elif item[0] == "exit":
                child, code = item[1], item[2]
                self._drain(child.n)
                self._close(child.n)
                say(event="exit", n=child.n, code=code)
                child.done.set()
            elif item[0] == "sync":  # everything written before the request is in a pipe
                for n in list(self._fds):
                    self._drain(n)
                say(event="synced", k=item[1])
            elif item[0] == "flush":  # what was posted before is reported
                item[1].set()

    def _add(self, child: Child, fd: int, notes: list[str]) -> None:
        os.set_blocking(fd, False)
        self._fds[child.n] = fd
        self._selector.register(fd, selectors.EVENT_READ, child.n)
        say(event="spawned", n=child.n, pid=child.pid, notes=notes)

    def _read(self, n: int) -> bool:
        """Forward what worker ``n`` wrote; False once there is nothing more now."""
        fd = self._fds.get(n)
        if fd is None:
            return False
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._close(n)
            return False
        self._emit(n, self._partial.pop(n, b"") + data)
        return True

    def _drain(self, n: int) -> None:
        while self._read(n):
            pass

    def _emit(self, n: int, data: bytes) -> None:
        *lines, rest = data.split(b"\n")
        if len(rest) > 65536:  # a very long line without an end goes out in pieces
            lines, rest = [*lines, rest], b""
        if rest:
            self._partial[n] = rest
        if lines:
            prefix = b"%s%d " % (OUT_TAG.encode(), n)
            _write(b"".join(prefix + line + b"\n" for line in lines))

    def _close(self, n: int) -> None:
        fd = self._fds.pop(n, None)
        if fd is not None:
            self._selector.unregister(fd)
            os.close(fd)
        rest = self._partial.pop(n, b"")
        if rest:
            _write(b"%s%d %s\n" % (OUT_TAG.encode(), n, rest))


class Host:
    """The host wrapper: starts this host's workers on the executor's requests and ends
    them all when the executor goes (end of input, silence, SIGTERM/SIGHUP)."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.grace = float(message.get("grace", 2.0))
        self.watchdog: float | None = message.get("watchdog")
        self.executor_id = str(message.get("executor_id", ""))
        self.preload = str(message.get("preload", ""))
        self.pump = Pump()
        self.children: dict[int, Child] = {}
        self._forks: dict[int, Child] = {}  # pid -> forked worker, until its exit
        self._early: dict[int, int] = {}  # pid -> code of a fork that ended before it was known
        self._limits: dict[tuple[Any, Any], tuple[list[str], str]] = {}
        # launchers by the numerical libraries' thread variables their imports were set up
        # under (`fiberexec.backend.thread_limits`; a worker has a share only with cpu=)
        self._launchers: dict[tuple[tuple[str, str], ...], Any] = {}
        self._ending = False
        self._lock = threading.Lock()

    def serve(self) -> None:
        threading.Thread(target=self.pump.run, name="pump", daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _hang_up)
        say(event="hello", pid=os.getpid())
        try:
            self._obey()
        except _Hangup:
            pass
        self._end_all()

    def _obey(self) -> None:
        """Requests from the executor, framed; until end of input or ``watchdog`` silence."""
        pending = b""
        while True:
            if not select.select([0], [], [], self.watchdog)[0]:
                say(event="note", text=f"no word from the executor for {self.watchdog:.0f}s; "
                                       "stopping this host's workers")
                return
            chunk = os.read(0, 65536)
            if not chunk:
                return
            pending += chunk
            while len(pending) >= 10 and len(pending) >= 10 + int(pending[:10]):
                size = int(pending[:10])
                self._on(json.loads(pending[10:10 + size]))
                pending = pending[10 + size:]

    def _on(self, request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "spawn":  # in a thread: spawns pipeline, and pings keep being read
            # what the executor's tasks need, learned here and in order: the launcher
            # imports it before its next fork, whichever request's thread asks first
            _learn(request.get("learn") or ())
            threading.Thread(target=self._spawn, args=(request,), daemon=True).start()
        elif op == "signal":
            child = self.children.get(int(request["n"]))
            if child is not None:
                child.signal(signal.SIGKILL if request.get("sig") == "kill" else signal.SIGTERM)
        elif op == "sync":
            self.pump.post("sync", request["k"])

    def _spawn(self, request: dict[str, Any]) -> None:
        n = int(request["n"])
        try:
            self._start(n, request)
        except Exception as exc:
            say(event="failed", n=n, why=f"{type(exc).__name__}: {exc}",
                transient=type(exc).__name__ == "LauncherError")

    def _start(self, n: int, request: dict[str, Any]) -> None:
        env = dict(os.environ)
        env.update(request["env"])
        env.update(request["secret_env"])
        env[ENV_MARK] = "1"
        notes = []
        workdir = request.get("workdir")
        if workdir and not os.path.isdir(workdir):
            notes.append(f"workdir {workdir!r} does not exist here; starting in {os.getcwd()}")
            workdir = None
        prefix, note = self._limits_for(request.get("cpu"), request.get("memory"))
        if note:
            notes.append(note)
        argv = list(request["argv"])
        read, write = os.pipe()
        try:
            if not prefix and len(argv) == 3 and tuple(argv[:2]) == FORKED[:2] \
                    and argv[2].startswith(FORKED[2]):
                child = self._fork(n, env, workdir or os.getcwd(), argv[2], write)
            else:
                argv = [sys.executable if a == "python" else a for a in argv]
                child = self._popen(n, prefix + argv, env, workdir, write)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._record(child, read, notes)

    def _limits_for(self, cpu: Any, memory: Any) -> tuple[list[str], str]:
        with self._lock:  # probed once per set of limits (systemd-run takes a while)
            if (cpu, memory) not in self._limits:
                self._limits[cpu, memory] = limits_prefix(cpu, memory)
            return self._limits[cpu, memory]

    def _fork(self, n: int, env: dict[str, str], cwd: str, program: str, out: int) -> Child:
        launcher = self._the_launcher(_thread_limits(env))
        try:
            proc = launcher.spawn(env=env, cwd=cwd, memory=None, log=None, program=program,
                                  output=out)
        except TypeError as exc:  # a launcher without output=: an older fiberexec here
            raise RuntimeError(
                f"the fiberexec on this host is older than the executor's ({exc}); install "
                "the executor's version of fiberexec into this host's Python") from None
        return Child(n, proc.pid, proc.send_signal)

    def _popen(self, n: int, argv: list[str], env: dict[str, str], cwd: str | None,
               out: int) -> Child:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        return Child(n, proc.pid, lambda sig: os.killpg(proc.pid, sig), proc.wait)

    def _record(self, child: Child, read: int, notes: list[str]) -> None:
        with self._lock:
            self.children[child.n] = child
            self._forks[child.pid] = child
            self.pump.post("add", child, read, notes)
            code = self._early.pop(child.pid, None)
            ending = self._ending
        if code is not None:
            self._exited(child, code)
        wait = child.wait
        if wait is not None:  # after "add": its exit is reported after it
            threading.Thread(target=lambda: self._exited(child, wait()), daemon=True).start()
        if ending:
            child.signal(signal.SIGKILL)

    def _the_launcher(self, key: tuple[tuple[str, str], ...]) -> Any:
        with self._lock:
            launcher = self._launchers.get(key)
            if launcher is None:
                from fiberexec.backend import ENV_PRELOAD, Launcher

                env = {**os.environ, ENV_MARK: "1", "FIBEREXEC_EXECUTOR_ID": self.executor_id,
                       **dict(key)}
                if self.preload:  # what the executor's FIBEREXEC_PRELOAD names
                    env[ENV_PRELOAD] = self.preload
                launcher = self._launchers[key] = Launcher(sys.executable, env,
                                                           self._fork_exited)
            return launcher

    def _fork_exited(self, proc: Any) -> None:
        with self._lock:
            child = self._forks.get(proc.pid)
            if child is None:  # it ended before its spawn was recorded
                self._early[proc.pid] = proc.returncode
                return
        self._exited(child, proc.returncode)

    def _exited(self, child: Child, code: int) -> None:
        with self._lock:
            self._forks.pop(child.pid, None)
            self.children.pop(child.n, None)
        self.pump.post("exit", child, code)

    def _end_all(self) -> None:
        """SIGTERM every worker, SIGKILL after the grace period; then let the launcher go."""
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        with self._lock:
            self._ending = True
            live = list(self.children.values())
        for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, END_WAIT)):
            for child in live:
                child.signal(sig)
            deadline = time.monotonic() + wait
            live = [c for c in live if not c.done.wait(max(0.0, deadline - time.monotonic()))]
            if not live:
                break
        with self._lock:
            launchers = list(self._launchers.values())
        for launcher in launchers:
            launcher.close(END_WAIT)
        flushed = threading.Event()  # exits already heard are reported before we leave
        self.pump.post("flush", flushed)
        flushed.wait(END_WAIT)


def _hang_up(*_: Any) -> None:
    raise _Hangup


def serve_host(message: dict[str, Any]) -> None:
    missing = _fiberexec_missing()
    if missing:
        say(event="error", kind="no-fiberexec", python=sys.executable, detail=missing)
        sys.exit(EXIT_NO_FIBEREXEC)
    Host(message).serve()


# ------------------------------------------------------------------ the stray finder


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _same_netns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def _argv(pid: int) -> list[str]:
    return _read(f"/proc/{pid}/cmdline").decode(errors="replace").split("\0")


def _is_wrapper(argv: list[str]) -> bool:
    return len(argv) >= 5 and argv[1] == "-c" and argv[3] == HOST_MARK


def _parent(pid: int) -> int:
    fields = _read(f"/proc/{pid}/stat").decode(errors="replace").rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def _wrapped(pid: int) -> bool:
    """Whether a wrapper (the worker's lease on this host) is among its ancestors."""
    for _ in range(4):  # the wrapper, maybe the launcher or a systemd-run between
        pid = _parent(pid)
        if pid <= 1:
            return False
        if _is_wrapper(_argv(pid)):
            return True
    return False


def _ours(pid: int) -> tuple[str, str, bool] | None:
    """``(what, executor id, lease held)`` when ``pid`` is one the ssh backend started."""
    argv = _argv(pid)
    if _is_wrapper(argv):
        return "host wrapper", argv[4], True
    if argv[1:3] != ["-m", "fiberexec.worker"]:
        return None
    environ = _read(f"/proc/{pid}/environ").decode(errors="replace").split("\0")
    env = {name: value.strip() for name, _, value in (  # (a forked worker's are padded)
        e.partition("=") for e in environ if e)}
    if env.get(ENV_MARK) != "1":
        return None
    # A forked worker's /proc environ is its launcher's, where it wrote its own ids
    worker = env.get("FIBEREXEC_WORKER_ID", "")
    what = f"worker {worker}" if worker else "worker"
    if _is_wrapper(_argv(_parent(pid))):
        what = "worker launcher" if "--launcher" in argv else what
    return what, env.get("FIBEREXEC_EXECUTOR_ID", ""), _wrapped(pid)


def _picked(message: dict[str, Any], executor_id: str, held: bool) -> bool:
    """`fiberexec.backend.Sweep.picks`, here where fiberexec may not be installed."""
    if message.get("everything"):
        return True
    if message.get("executor_id") is not None:
        return bool(executor_id == message["executor_id"])
    return not held


def _gone_within(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):  # old Python or kernel: report what we could not see
        return not os.path.exists(f"/proc/{pid}")
    try:  # (poll: select refuses descriptors from 1024 on, which a busy host session has)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(max(0.0, timeout) * 1000))
    finally:
        os.close(fd)


def find_strays(message: dict[str, Any]) -> None:
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _same_netns(int(entry)):
            ours = _ours(int(entry))
            if ours is not None and _picked(message, ours[1], ours[2]):
                found[int(entry)] = f"{ours[0]} of executor {ours[1] or '?'}"
    if not message.get("dry_run"):
        _signal_all(found, float(message.get("grace", 3.0)))
    say(event="strays", found={str(p): what for p, what in sorted(found.items())})


def _signal_all(found: dict[int, str], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait
        for pid in list(found):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
        left = [p for p in found if not _gone_within(p, max(0.0, deadline - time.monotonic()))]
        if not left:
            break


def main(message: dict[str, Any]) -> None:
    if message.get("action") == "strays":
        find_strays(message)
    else:
        serve_host(message)


if __name__ == "__fiberexec_ssh__":
    main(globals()["MESSAGE"])
