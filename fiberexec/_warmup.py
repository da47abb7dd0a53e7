"""The installed libraries the launcher's children import, imported once by the launcher.

A worker forked by the launcher (`fiberexec._launcher`) starts with what the launcher has
loaded. Without this, each one imports its tasks' libraries itself (numpy: 40-70 ms of CPU
here, scipy.stats: 0.6 s), where a worker the standard library forks has them from its
parent. So the launcher learns them from its children, and the children forked after that
start with them loaded, as the stdlib's ``forkserver`` children start with what it preloads:

    child (worker, Process)                      launcher
      about to wait, its modules grew:
      the new ones, if installed  --datagram-->  `Learner.take`: names not tried before
                                                 when no fork is asked for (`Learner.warm`):
                                                   a trial child imports them, output
                                                   discarded; if it started no thread and
                                                   ended within TRIAL_TIMEOUT, the launcher
                                                   imports those that imported there
      the next children start with them

Only installed libraries are learned: modules whose file lies in this interpreter's library
directories (site-packages and the standard library's). A user's own modules (beside the
script, in the working directory, an editable install) are never preloaded, so a module
edited between two executors is read afresh by the next one's workers, as without a
launcher. A library that starts a Python thread when imported is not preloaded (a fork keeps
only the forking thread, and whatever lock another thread held stays held); neither is one
whose import fails, crashes or takes longer than TRIAL_TIMEOUT in the trial.

One difference remains, as with ``forkserver``'s preloading: what a library does on import
(a logging handler bound to ``sys.stderr``, a signal handler) then happens in the launcher,
before the worker sets up its own output and handlers rather than after.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

TRIAL_TIMEOUT = 30.0  # seconds a trial import may take before its names are given up
TRIAL_NICE = 10  # the trial child's niceness, added
END = "\n."  # the trial child's last words: it got to the end
PR_SET_PDEATHSIG = 1  # prctl(2)
DATAGRAM_MAX = 32 << 10  # bytes of names in one report (more: several reports)
NAMES_MAX = 20_000  # names a launcher tries at most, over its life


_dirs: list[tuple[str, ...]] = []


def _library_dirs() -> tuple[str, ...]:
    """This interpreter's library directories, each ending in a separator."""
    if not _dirs:
        import sysconfig

        paths = sysconfig.get_paths()
        found = {paths[key] for key in ("purelib", "platlib", "stdlib", "platstdlib")
                 if key in paths}
        found |= {os.path.realpath(path) for path in found}  # a module's path is either
        _dirs.append(tuple(sorted(path.rstrip(os.sep) + os.sep for path in found)))
    return _dirs[0]


# ---------------------------------------------------------------------------- a child's side

_sock: socket.socket | None = None
_told: set[str] = set()
_looked = 0  # len(sys.modules) when last looked at


def attach(fd: int) -> None:
    """In a child the launcher forked: report imports over the datagram socket ``fd``."""
    global _sock, _looked
    _sock = socket.socket(fileno=fd)
    _sock.setblocking(False)
    _told.update(sys.modules)  # the launcher has these
    _looked = len(sys.modules)


def report() -> None:
    """Tell the launcher the installed modules imported since the last report (a length
    comparison when there are none: cheap enough for every wait)."""
    global _looked, _sock
    if _sock is None or len(sys.modules) == _looked:
        return
    _looked = len(sys.modules)
    new = [name for name in list(sys.modules) if name not in _told]
    _told.update(new)
    dirs = _library_dirs()
    names = [name for name in new if _installed(name, dirs)]
    for chunk in _chunks(names):
        try:
            _sock.send(chunk)
        except OSError:  # the launcher is busy (a full buffer) or gone: it learns no more
            _sock.close()
            _sock = None
            return


def _installed(name: str, dirs: tuple[str, ...]) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not os.path.isabs(origin) or name.startswith(
            ("fiberexec", "__main__", "__mp_main__")):
        return False
    return origin.startswith(dirs)


def _chunks(names: list[str]) -> list[bytes]:
    chunks: list[bytes] = []
    part: list[str] = []
    size = 0
    for name in names:
        if part and size + len(name) + 1 > DATAGRAM_MAX:
            chunks.append("\n".join(part).encode())
            part, size = [], 0
        part.append(name)
        size += len(name) + 1
    if part:
        chunks.append("\n".join(part).encode())
    return chunks


# ---------------------------------------------------------------------------- the launcher's


class Learner:
    """The launcher's side: names its children reported, tried, then imported.

    A trial child imports what was reported while the launcher goes on forking (its pipe
    is one more descriptor the launcher polls, `trial_fd`). The launcher imports what the
    trial showed safe while no request waits, one name at a time, giving way as soon as
    one comes (``interrupted``); meanwhile its signal handler reports children's exits
    (``learning``), so a shutdown is not held up."""

    def __init__(self) -> None:
        self.reader, self.writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.reader.setblocking(False)
        self._reported: dict[str, None] = {}  # not tried yet, in the order first reported
        self._safe: list[str] = []  # a trial imported them: for the launcher to import
        self._seen: set[str] = set(sys.modules)
        self._trial: _Trial | None = None
        self.trials: set[int] = set()  # trial children not reaped yet (not workers)
        self.learning = False  # in `learn`: the launcher's signal handler reports exits
        self.threads_seen = False  # an import started a thread after all: learn no more

    @property
    def trial_fd(self) -> int | None:
        return None if self._trial is None else self._trial.fd

    def trial_fds(self) -> tuple[int, ...]:
        """The launcher's descriptors of a running trial (which a forked worker closes)."""
        return () if self._trial is None else (self._trial.fd,)

    @property
    def has_work(self) -> bool:
        """Something to import, or a trial to start, while no request waits."""
        return not self.threads_seen and self._trial is None and bool(
            self._safe or self._reported)

    def deadline(self) -> float | None:
        """When the running trial is given up (`time.monotonic`), if one runs."""
        return None if self._trial is None else self._trial.deadline

    def take(self) -> None:
        """Read what the children reported."""
        while True:
            try:
                data = self.reader.recv(DATAGRAM_MAX + 1)
            except (BlockingIOError, InterruptedError):
                return
            for name in data.decode(errors="replace").split("\n"):
                if name and name not in self._seen and len(self._seen) < NAMES_MAX:
                    self._seen.add(name)
                    self._reported[name] = None

    def learn(self, closes: tuple[int, ...], interrupted: Callable[[], bool]) -> bool:
        """(No request waiting.) Import some of what a trial showed safe, until
        ``interrupted``; or start a trial of what was reported (a child that closes
        ``closes``, the launcher's descriptors). Whether anything was imported here."""
        if not self._safe:
            names, self._reported = list(self._reported), {}
            self._trial = _Trial.start(names, closes)
            if self._trial is not None:
                self.trials.add(self._trial.pid)
            return False
        imported = False
        self.learning = True
        try:
            while self._safe and not interrupted():
                imported |= _quietly_import(self._safe.pop(0))
                if threading.active_count() > 1:
                    self.threads_seen = True
                    self._safe.clear()
        finally:
            self.learning = False
        return imported

    def trial_read(self) -> bool:
        """The trial's pipe is readable (or its time is up); whether the trial is over."""
        trial = self._trial
        assert trial is not None
        if not trial.read():
            return False
        self._trial = None
        self._safe.extend(trial.names())
        return True


class _Trial:
    """A forked child importing ``names`` (see `Learner`): what it imported comes back
    over a pipe, ended by `END`, if it started no thread."""

    def __init__(self, pid: int, fd: int, names: list[str]) -> None:
        self.pid, self.fd = pid, fd
        self.deadline = time.monotonic() + TRIAL_TIMEOUT
        self.tried = names
        self._parts: list[bytes] = []
        self._done: bytes | None = None

    @classmethod
    def start(cls, names: list[str], closes: tuple[int, ...]) -> _Trial | None:
        read, write = os.pipe()
        launcher = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return None
        if pid == 0:
            _try(names, closes, read, write, launcher)
        os.close(write)
        os.set_blocking(read, False)
        return cls(pid, read, names)

    def read(self) -> bool:
        """Read what came; whether the trial is over (its end, or its time up)."""
        while self._done is None:
            try:
                part = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                if time.monotonic() < self.deadline:
                    return False
                # its time is up: what it said so far lacks `END`; it goes (not reaped
                # yet, so the pid is still its own)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                part = b""
            if part:
                self._parts.append(part)
                continue
            self._done = b"".join(self._parts)
            os.close(self.fd)
        return True

    def names(self) -> list[str]:
        """What it imported; none if it did not say it got to the end."""
        data = (self._done or b"").decode(errors="replace")
        return [name for name in data[:-len(END)].split("\n") if name] if data.endswith(
            END) else []


def _try(names: list[str], closes: tuple[int, ...], read: int, write: int,
         launcher: int) -> None:
    """The trial child: import ``names``, say which imported, if no thread started."""
    code = 1
    try:
        _die_with(launcher)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.nice(TRIAL_NICE)  # behind the workers, whose own imports it repeats
        os.close(read)
        for fd in closes:
            os.close(fd)
        imported = [name for name in names if _quietly_import(name)]
        if threading.active_count() == 1:
            with os.fdopen(write, "wb") as out:
                out.write(("\n".join(imported) + END).encode())
            code = 0
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:
    """(Linux) This process is killed when ``parent`` ends, a hung import included."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before that took effect
        os._exit(1)


def _quietly_import(name: str) -> bool:
    """Import ``name`` with this process's standard output and error discarded."""
    import importlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        importlib.import_module(name)
        return True
    except BaseException:  # a library that cannot load here is not preloaded
        return False
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
