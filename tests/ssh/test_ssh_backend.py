"""The ssh backend against real sshd on the test bed's worker hosts."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from fiberexec import ConfigurationError
from fiberexec.backend import (
    PermanentBackendError,
    TransientBackendError,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    available_backends,
    load_backend,
)
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends._ssh_hosts import Placement, SSHHost, parse_hosts, read_inventory
from fiberexec.backends._ssh_session import classify
from fiberexec.backends.ssh import SSHBackend, remove_stray
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_ssh import backend_options, finished, spec, ssh_processes
from tests.testbed.session import Lab

Maker = Callable[..., SSHBackend]


def remote_pid(handle: WorkerHandle) -> int:
    return int(handle.ref.rsplit("#", 1)[1])


# ------------------------------------------------------------------ jobs through the seam


def test_job_output_exit_code_and_host(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w2")])
    handle = backend.start_worker(spec("j1", "import socket; print('hello from', "
                                             "socket.gethostname()); raise SystemExit(7)"))
    assert handle.ref.startswith(f"{lab.site.target('w2')}#")
    status = finished(backend, handle)
    assert status == WorkerStatus(WorkerState.EXITED, exit_code=7)
    assert "hello from" in backend.logs(handle)
    assert backend.status(handle).exit_code == 7


def test_a_signal_is_reported_as_a_negative_exit_code(make_backend: Maker) -> None:
    backend = make_backend()
    handle = backend.start_worker(spec("j2", "import os, signal; os.kill(os.getpid(), 9)"))
    assert finished(backend, handle).exit_code == -9
    assert "killed by signal 9 (SIGKILL)" in backend.status(handle).describe()


def test_stop_terminates_the_remote_process(make_backend: Maker) -> None:
    backend = make_backend()
    handle = backend.start_worker(spec("j3", "import time; time.sleep(600)"))
    remote = psutil.Process(remote_pid(handle))  # one machine: the pid is visible here
    assert remote.is_running() and backend.status(handle).state is WorkerState.RUNNING
    backend.stop(handle, grace=5)
    assert not psutil.pid_exists(remote.pid) or remote.status() == psutil.STATUS_ZOMBIE
    assert backend.status(handle).state is WorkerState.EXITED


def test_the_worker_dies_with_its_ssh_session(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend()
    handle = backend.start_worker(spec("j4", "import time; time.sleep(600)"))
    job = psutil.Process(remote_pid(handle))
    clients = [p for p in ssh_processes(lab) if p.name() == "ssh"]
    assert [p.pid for p in clients] == list(backend.sessions().values())
    clients[0].kill()  # the session is gone, as when the executor's process is killed
    gone, alive = psutil.wait_procs([job], timeout=10)
    assert gone and not alive, "the remote job outlived its SSH session"
    assert finished(backend, handle).reason is not None


def test_slots_spread_workers_over_hosts(make_backend: Maker, make_executor: ExecutorFactory,
                                         lab: Lab) -> None:
    backend = make_backend(slots=2)
    ex = make_executor(6, backend=backend)
    pids = set(ex.map(tasks.sleep_return, [0.3] * 6, [0] * 6))
    assert pids == {0}
    assert sorted(backend.placement.load().values()) == [2, 2, 2]
    # Running workers sit where their slots are, two at most per host (the map may have
    # needed fewer than six: the others may still be starting)
    hosts = Counter(h for h, _ in backend.placements().values())
    assert hosts and set(hosts) <= set(lab.targets()) and max(hosts.values()) <= 2, hosts


def test_full_slots_are_a_transient_error_naming_the_fix(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w1")], slots=1)
    backend.start_worker(spec("j5", "import time; time.sleep(600)"))
    with pytest.raises(TransientBackendError, match="all 1 slots on 1 ssh hosts are taken"):
        backend.start_worker(spec("j6", "pass"))


def test_per_host_python(make_backend: Maker, lab: Lab, tmp_path: Path) -> None:
    venv = tmp_path / "venv-for-w3"  # the same environment under another path
    venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    link = venv / "bin" / "python"
    backend = make_backend(hosts=[{"host": lab.site.target("w3"), "python": str(link)}])
    handle = backend.start_worker(spec("j7", "import sys; print('argv0', sys.executable)"))
    finished(backend, handle)
    assert f"argv0 {link}" in backend.logs(handle)


def test_limits_without_user_systemd_are_stated(make_backend: Maker,
                                                caplog: pytest.LogCaptureFixture) -> None:
    backend = make_backend()
    job = WorkerSpec(worker_id="j8", executor_id="t", command=("python", "-c", "pass"),
                     resources=__import__("fiberexec.backend").backend.Resources(
                         cpu=0.5, memory=256 << 20))
    with caplog.at_level(logging.WARNING, logger="fiberexec.ssh"):
        handle = backend.start_worker(job)
    finished(backend, handle)
    assert any("cpu=0.5 memory=268435456 not enforced" in r.getMessage() for r in caplog.records)


def test_systemd_run_prefix() -> None:
    assert remote.systemd_run_argv("/bin/systemd-run", 1.5, 2**30) == [
        "/bin/systemd-run", "--user", "--scope", "--quiet", "--collect",
        "-p", "CPUQuota=150%", "-p", f"MemoryMax={2**30}", "-p", "MemorySwapMax=0", "--"]


# ------------------------------------------------------------------ the executor on ssh


def test_secret_travels_only_inside_the_channel(make_backend: Maker,
                                                make_executor: ExecutorFactory, lab: Lab,
                                                log_event: Callable[[str, int], threading.Event],
                                                ) -> None:
    began = time.time() - 2  # (a file's time is coarser than the clock's)
    connected = log_event("connected", 2)
    ex = make_executor(2, backend=make_backend())
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    assert connected.wait(60)
    secret = ex._pool.secret.hex()  # type: ignore[union-attr]
    procs = ssh_processes(lab)
    assert any(p.name() == "ssh" for p in procs) and len(procs) >= 4  # client, wrapper, worker
    for proc in procs:
        assert secret not in " ".join(proc.cmdline())
    # Forked by each host's launcher: their /proc environ is the launcher's, which has none
    workers = [p for p in procs if p.cmdline()[1:3] == ["-m", "fiberexec.worker"]
               and remote.HOST_MARK not in p.parent().cmdline()]
    assert len(workers) == 2 and all("FIBEREXEC_SECRET" not in p.environ() for p in workers)
    # the secret is new: only a file written since the test began could hold it (the
    # working directory of a CI run holds a gigabyte of environments, too slow to read)
    roots = [lab.site.root, Path("/dev/shm"), Path("~/.ssh").expanduser(), Path.cwd()]
    holding = []
    for path in _written_since(began, roots):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if secret.encode() in path.read_bytes():
                holding.append(path)
    assert not holding, f"the secret is in files: {holding}"


def _written_since(began: float, roots: list[Path]) -> list[Path]:
    """The regular files below ``roots`` modified at ``began`` or later."""
    found = []
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder, name)
                with contextlib.suppress(OSError):  # gone meanwhile
                    info = path.lstat()  # (a link is not followed, as by grep -r)
                    if stat.S_ISREG(info.st_mode) and info.st_mtime >= began:
                        found.append(path)
    return found


def test_a_hosts_launcher_forks_workers_with_what_the_first_task_needs(
        make_backend: Maker, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """The first task's function names the installed modules it needs; each host's launcher
    imports those installed there before it forks (as the executor's host's launcher does),
    so its workers start with them, as forked stdlib workers have them from their parent."""
    watched = "tabnanny"  # installed (the standard library), imported by nothing of ours
    (tmp_path / "taught_over_ssh.py").write_text(
        f"import sys\nHAD = {watched!r} in sys.modules\nimport {watched}\n"
        "def had(_):\n    return HAD\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # (the worker hosts share this file system)
    taught = importlib.import_module("taught_over_ssh")
    ex = make_executor(4, backend=make_backend(slots=2))
    assert all(ex.map(taught.had, range(16), timeout=120))


def test_a_hosts_launcher_imports_under_the_thread_share_of_the_workers_it_forks(
        make_backend: Maker, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """With ``cpu=``, a worker's numerical libraries start that many threads. The first
    task's module imports numpy, so each host's launcher imports it before it forks: under
    the workers' thread variables, so they keep to their share (OpenBLAS would start one
    thread per CPU here)."""
    (tmp_path / "blas_over_ssh.py").write_text(
        "import numpy\nfrom tests.tasks import blas_threads\n"
        "def threads(_):\n    return blas_threads()[1]\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # (the worker hosts share this file system)
    module = importlib.import_module("blas_over_ssh")
    ex = make_executor(4, backend=make_backend(slots=2), cpu=1)
    assert list(ex.map(module.threads, range(16), timeout=120)) == [[1]] * 16


def test_workers_dial_the_executor_hosts_address(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend()
    assert backend.advertise_host == backend.bind_host == lab.executor_address


def test_remove_stray_stops_orphaned_workers(make_backend: Maker, make_executor: ExecutorFactory,
                                             lab: Lab, tmp_path: Path) -> None:
    import select

    backend = make_backend(hosts=[lab.site.target("w1")])
    ex = make_executor(1, backend=backend, max_task_retries=0)  # the stuck task is not rerun
    worker_pid = ex.submit(tasks.pid).result(timeout=60)
    launcher = psutil.Process(worker_pid).parent()
    wrapper = launcher.parent() if launcher is not None else None
    assert wrapper is not None and remote.HOST_MARK in wrapper.cmdline()
    executor_id = ex.executor_id
    # The executor lets a worker go when its host's session ends; one stuck in a C call that
    # holds the GIL stays, as one would whose connection outlived its wrapper. (A stopped
    # one does not: its process group is orphaned as the launcher exits, and the kernel
    # sends it SIGHUP.)
    said = tmp_path / "holding"
    os.mkfifo(said)
    ex.submit(tasks.hold_the_gil, str(said))
    fifo = os.open(said, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert select.select([fifo], [], [], 60)[0], "the task did not start"
        assert os.read(fifo, 64) == b"holding\n"
    finally:
        os.close(fifo)
    wrapper.kill()
    assert psutil.wait_procs([launcher], timeout=10)[0], "the launcher outlived its wrapper"
    assert psutil.Process(worker_pid).is_running()
    options = backend_options(lab)
    assert remove_stray(executor_id="someone-else", **options) == []
    removed = remove_stray(**options)  # its wrapper, the executor's lease there, is gone
    assert removed == [f"removed worker w0 of executor {executor_id} on "
                       f"{lab.site.target('w1')} (pid {worker_pid})"], removed
    gone, _ = psutil.wait_procs([psutil.Process(worker_pid)], timeout=10)
    assert gone


def test_cleanup_command_visits_the_configured_hosts(lab: Lab) -> None:
    env = {**os.environ, "FIBEREXEC_BACKEND": "ssh",
           "FIBEREXEC_BACKEND_OPTIONS": json.dumps(backend_options(lab))}
    done = subprocess.run([sys.executable, "-m", "fiberexec", "cleanup", "--backend", "ssh"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ssh: no stray workers"


# ------------------------------------------------------------------ configuration


def test_hosts_from_lists_and_inventories(tmp_path: Path) -> None:
    parsed = parse_hosts(["me@a", "me@b:2222 slots=3", {"host": "me@c", "python": "/v/py"}],
                         python="python3", slots=None)
    assert parsed == [SSHHost("me@a"), SSHHost("me@b", 2222, 3),
                      SSHHost("me@c", python="/v/py")]
    toml = tmp_path / "hosts.toml"
    toml.write_text('[[hosts]]\nhost = "me@a"\nslots = 2\n\n[[hosts]]\nhost = "me@b"\n')
    assert read_inventory(toml, python="py", slots=4) == [SSHHost("me@a", None, 2, "py"),
                                                          SSHHost("me@b", None, 4, "py")]
    text = tmp_path / "hosts"
    text.write_text("# workers\nme@a  python=/x/python\n\nme@b:23\n")
    assert read_inventory(text, python="py", slots=None) == [SSHHost("me@a", python="/x/python"),
                                                             SSHHost("me@b", 23, python="py")]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "needs hosts= .* or inventory="),
    ({"hosts": []}, "at least one host"),
    ({"hosts": ["-oProxyCommand=x"]}, "must be a destination"),
    ({"hosts": [{"host": "a", "slots": 0}]}, "slots of a must be >= 1"),
    ({"hosts": [{"host": "a", "cores": 2}]}, "unknown: \\['cores'\\]"),
    ({"hosts": ["a"], "connect_timeout": 0}, "connect_timeout must be > 0"),
])
def test_bad_configuration_names_the_rule(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SSHBackend(**kwargs)  # type: ignore[arg-type]


def test_backend_is_found_by_name() -> None:
    assert "ssh" in available_backends()
    backend = load_backend("ssh", hosts=["me@a"], slots=2)
    assert isinstance(backend, SSHBackend)
    assert backend.placement.hosts() == [SSHHost("me@a", slots=2)]
    backend.close()


def test_ssh_errors_are_classified() -> None:
    host = SSHHost("me@h")

    def kind(code: int, stderr: str) -> type:
        return type(classify(host, code, stderr, None, "w0"))

    assert kind(255, "me@h: Permission denied (publickey).") is PermanentBackendError
    assert kind(255, "Host key verification failed.") is PermanentBackendError
    assert kind(255, "ssh: Could not resolve hostname h: Name") is PermanentBackendError
    for transient in ("Connection refused", "Connection timed out", "No route to host"):
        assert kind(255, f"ssh: connect to host h port 22: {transient}") is TransientBackendError
    assert kind(127, "sh: 1: exec: /nope: not found") is PermanentBackendError
    error = classify(host, 3, "", {"kind": "no-fiberexec", "python": "/v/bin/python",
                                   "detail": "No module named 'fiberexec'"}, "w0")
    assert "me@h" in str(error) and "cannot import fiberexec" in str(error)


def test_placement_spreads_and_steers_around_failing_hosts() -> None:
    now = [0.0]
    a, b = SSHHost("me@a", slots=2), SSHHost("me@b", slots=2)
    placement = Placement([a, b], cooldown=30, clock=lambda: now[0])
    assert [placement.reserve(w) for w in ("w0", "w1")] == [a, b]  # least loaded first
    placement.suspect(a)
    assert placement.reserve("w2") == b  # a failed: b while it has room
    assert placement.reserve("w3") == a  # b is full: a, cooling or not
    with pytest.raises(TransientBackendError, match="all 4 slots on 2 ssh hosts are taken"):
        placement.reserve("w4")
    placement.stopping(b, "w1")  # the slot frees at once, b is avoided while it stops
    now[0] = 31.0
    placement.release("w3")
    assert placement.reserve("w5") == a
    placement.stopped(b, answered=False)  # b did not answer: it cools down
    placement.release("w0")
    assert placement.reserve("w6") == a
    assert placement.load() == {"me@a": 2, "me@b": 1}


def test_remove_stray_names_hosts_it_could_not_clean(lab: Lab) -> None:
    options = backend_options(lab, hosts=[lab.site.target("w1"),
                                          {"host": lab.site.target("w2"), "port": 2222}])
    with pytest.raises(TransientBackendError, match=r"cannot clean up on root@10\.99\.0\.12:2222 "
                                                    r"\(.*Connection refused"):
        remove_stray(**options)


def test_workers_on_other_hosts_reach_a_fixed_port_range(
        make_backend: Maker, make_executor: ExecutorFactory, lab: Lab) -> None:
    # below the kernel's ephemeral range (32768-60999): the backend's own outgoing
    # connections from this host could otherwise hold a port of the range
    ex = make_executor(4, backend=make_backend(slots=2), ports="29000-29003")
    assert list(ex.map(tasks.square, range(40), timeout=60)) == [i * i for i in range(40)]
    pool = ex._pool  # type: ignore[union-attr]
    ports = {int(c.channel.address.rsplit(":", 1)[1]) for s in pool.shards
             for c in s.conns.values()}
    assert ports and ports <= set(range(29000, 29004))
    assert all(f"//{lab.executor_address}:" in c.channel.address for s in pool.shards
               for c in s.conns.values())
