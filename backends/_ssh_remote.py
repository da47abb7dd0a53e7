"""What the ssh backend runs on a worker host, shipped over the SSH channel on every start.

The remote command is short and holds no secret::

    exec <python> -c '<LOADER>' fiberexec-ssh-worker <executor id> <worker id>

`LOADER` reads one length-prefixed JSON message from stdin (this module's source plus the
message: the worker's environment including the executor's secret, its command, workdir and
limits) and runs it.
So secrets travel only inside the encrypted SSH channel, never on a command line or in a file.
This module must therefore stay importable by any Python 3.8+ with the standard library only.

As a **worker wrapper** (``action == "worker"``) it checks that fiberexec is importable,
starts the worker in a session of its own (under ``systemd-run --user --scope`` with
``CPUQuota=``/``MemoryMax=`` when limits were asked for and the host can), reports on stdout
in lines starting with `TAG`, and then obeys its stdin: ``term``/``kill`` lines signal the
worker, ``ping`` lines (sent every second) prove the executor is still there. End of input
(the SSH session closed, the executor died) or no line for ``watchdog`` seconds (the network
between them failed, even while the worker is deep in a long task) terminates the worker,
SIGKILL after the grace period. The wrapper exits with the worker, reporting its exit code.

As a **stray finder** (``action == "strays"``) it signals the workers the ssh backend started
in this host's network namespace that the message picks: by default those whose wrapper is
gone (a wrapper is its executor's lease here: it lives only while the executor pings it),
or one executor's workers and wrappers, or all of them; it reports which it found.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

TAG = "#fiberexec-ssh "
WORKER_MARK = "fiberexec-ssh-worker"  # argv[1] of every wrapper: how ps and strays find them
CLEANUP_MARK = "fiberexec-ssh-cleanup"
ENV_MARK = "FIBEREXEC_SSH_WORKER"  # set in every worker's environment
EXIT_NO_FIBEREXEC = 3
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


def say(**event: Any) -> None:
    """One report line for the executor; a closed channel is not this process's problem."""
    try:
        sys.stdout.write(TAG + json.dumps(event) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


# ------------------------------------------------------------------ the worker wrapper


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


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end(proc: subprocess.Popen[bytes], grace: float) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)


def _obey(proc: subprocess.Popen[bytes], grace: float, watchdog: float | None) -> None:
    """Commands from the executor on stdin (``term``, ``kill``, ``sync N``; ``ping`` only
    proves it is there). End of input, or no word for ``watchdog`` seconds, ends the worker."""
    pending = b""
    while True:
        readable = select.select([0], [], [], watchdog)[0]
        if not readable:
            say(event="note", text=f"no word from the executor for {watchdog:.0f}s; stopping")
            break
        chunk = os.read(0, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.strip() == b"term":
                _signal_group(proc, signal.SIGTERM)
            elif line.strip() == b"kill":
                _signal_group(proc, signal.SIGKILL)
            elif line.startswith(b"sync "):  # the worker shares our stdout: whatever it
                # wrote before this reaches the executor before the answer
                say(event="synced", n=int(line.split()[1]))
    _end(proc, grace)


def serve_worker(message: dict[str, Any]) -> None:
    missing = _fiberexec_missing()
    if missing:
        say(event="error", kind="no-fiberexec", python=sys.executable, detail=missing)
        sys.exit(EXIT_NO_FIBEREXEC)
    env = dict(os.environ)
    env.update(message["env"])
    env.update(message["secret_env"])
    env[ENV_MARK] = "1"
    notes = []
    workdir = message.get("workdir")
    if workdir and not os.path.isdir(workdir):
        notes.append(f"workdir {workdir!r} does not exist here; starting in {os.getcwd()}")
        workdir = None
    prefix, note = limits_prefix(message.get("cpu"), message.get("memory"))
    if note:
        notes.append(note)
    argv = [sys.executable if a == "python" else a for a in message["argv"]]
    proc = subprocess.Popen(prefix + argv, env=env, cwd=workdir or None,
                            stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    say(event="ready", pid=proc.pid, notes=notes)
    grace = float(message.get("grace", 2.0))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: threading.Thread(target=_end, args=(proc, grace)).start())
    watchdog = message.get("watchdog")
    threading.Thread(target=_obey, args=(proc, grace, watchdog), daemon=True).start()
    code = proc.wait()
    say(event="exit", code=code)


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
    return len(argv) >= 5 and argv[1] == "-c" and argv[3] == WORKER_MARK


def _parent(pid: int) -> int:
    fields = _read(f"/proc/{pid}/stat").decode(errors="replace").rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def _wrapped(pid: int) -> bool:
    """Whether a wrapper (the worker's lease on this host) is among its ancestors."""
    for _ in range(4):  # the wrapper, maybe a systemd-run or limits shell between
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
        return f"wrapper of worker {argv[5] if len(argv) > 5 else '?'}", argv[4], True
    if argv[1:3] != ["-m", "fiberexec.worker"]:
        return None
    environ = _read(f"/proc/{pid}/environ").decode(errors="replace").split("\0")
    env = dict(e.partition("=")[::2] for e in environ if e)
    if env.get(ENV_MARK) != "1":
        return None
    return (f"worker {env.get('FIBEREXEC_WORKER_ID', '?')}", env.get("FIBEREXEC_EXECUTOR_ID", ""),
            _wrapped(pid))


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
    try:
        return bool(select.select([fd], [], [], timeout)[0])
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
        serve_worker(message)


if __name__ == "__fiberexec_ssh__":
    main(globals()["MESSAGE"])
