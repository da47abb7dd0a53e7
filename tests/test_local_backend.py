"""Local-backend specifics: collected only when the suite runs on the local backend.

(Docker and Kubernetes have their own external-kill chaos tests: ``docker kill`` and a pod
deleted mid-map.)
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

import pytest

from fiberexec import BrokenFiberExecutor
from fiberexec.backend import (
    Resources,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
    shared_launchers,
)
from fiberexec.backends.local import LocalBackend
from tests import tasks
from tests.conftest import ExecutorFactory


def test_kill_dash_9_of_busy_worker_from_outside(make_executor: ExecutorFactory) -> None:
    from tests.support.backend_local import worker_processes

    ex = make_executor(2)
    futures = [ex.submit(tasks.sleep_return, 0.1, i) for i in range(30)]
    assert futures[0].result(timeout=30) == 0  # workers are busy now
    os.kill(worker_processes()[0].pid, signal.SIGKILL)
    assert [f.result(timeout=60) for f in futures] == list(range(30))
    assert ex.stats().workers_lost == 1


# -- the backend itself ------------------------------------------------------------------------
def _spec(worker_id: str, code: str) -> WorkerSpec:
    return WorkerSpec(worker_id=worker_id, executor_id="local-test",
                      command=("python", "-c", code))


def _open_files_under(directory: str) -> list[str]:
    """Files this process holds open whose path starts with ``directory``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(directory):
                found.append(target)
    return found


def test_captured_output_holds_no_descriptor_per_worker() -> None:
    backend = LocalBackend(capture_output=True)
    exits: queue.Queue[WorkerStatus] = queue.Queue()
    try:
        handles = [backend.start_worker(_spec(f"w{i}", f"print('out {i}')")) for i in range(6)]
        for handle in handles:
            backend.watch(handle, lambda _, status: exits.put(status))
        assert [exits.get(timeout=30).exit_code for _ in handles] == [0] * 6
        logs = [f for f in _open_files_under(tempfile.gettempdir()) if "fiberexec-logs-" in f]
        assert logs == []  # each worker's log file is open in the worker only
        assert backend.logs(handles[3]).strip() == "out 3"
    finally:
        backend.close()


def test_one_reaper_thread_reports_every_exit() -> None:
    backend = LocalBackend()
    exits: queue.Queue[tuple[str, WorkerStatus]] = queue.Queue()
    before = {t.ident for t in threading.enumerate()}
    try:
        handles = [backend.start_worker(_spec(f"w{i}", "import time; time.sleep(60)"))
                   for i in range(8)]
        for handle in handles:
            backend.watch(handle, lambda h, status: exits.put((h.worker_id, status)))
        new = [t.name for t in threading.enumerate() if t.ident not in before]
        assert new == ["fiberexec-local-reaper"]
        os.kill(int(handles[5].ref), signal.SIGKILL)
        assert exits.get(timeout=30) == ("w5", WorkerStatus(WorkerState.EXITED, exit_code=-9))
        quick = backend.start_worker(_spec("quick", "raise SystemExit(7)"))
        backend.watch(quick, lambda h, status: exits.put((h.worker_id, status)))
        assert exits.get(timeout=30) == ("quick", WorkerStatus(WorkerState.EXITED, exit_code=7))
        assert exits.empty()
    finally:
        backend.close()
    assert [t.name for t in threading.enumerate() if t.ident not in before] == []
    assert exits.empty()  # workers stopped on purpose are not reported


def test_an_exit_read_while_another_thread_reads_it_is_still_reported() -> None:
    """`Popen.poll` answers None while another thread holds the process's waitpid lock
    (reading its exit at that moment): the reaper, which saw the exit on the pidfd, must
    still report it (it once dropped it, and the executor waited start_timeout for a
    worker long gone)."""
    backend = LocalBackend(launcher=False)
    exits: queue.Queue[WorkerStatus] = queue.Queue()
    try:
        handle = backend.start_worker(_spec("w0", "import sys; sys.stdin.read()"))
        proc = backend._procs[f"w0 {handle.ref}"]
        assert isinstance(proc, subprocess.Popen)
        backend.watch(handle, lambda _, status: exits.put(status))
        with proc._waitpid_lock:  # type: ignore[attr-defined]  # as another reader holds it
            os.kill(proc.pid, signal.SIGKILL)
            with pytest.raises(queue.Empty):
                exits.get(timeout=0.3)  # the reaper saw it, and waits for the lock
        assert exits.get(timeout=30) == WorkerStatus(WorkerState.EXITED, exit_code=-9)
    finally:
        backend.close()


# -- memory= on local processes ------------------------------------------------------------------
def test_memory_limits_each_worker_address_space(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, memory="300M")
    assert ex.submit(tasks.address_space_limit).result(timeout=60) == (300 * 10**6,) * 2
    assert ex.submit(tasks.getenv, "MALLOC_ARENA_MAX").result(timeout=60) == "1"
    assert ex.submit(tasks.allocate_mib, 10).result(timeout=60) == 10
    with pytest.raises(MemoryError) as raised:
        ex.submit(tasks.allocate_mib, 600).result(timeout=60)
    assert raised.value.__notes__ == [
        "this worker's address space is limited to 300000000 bytes (RLIMIT_AS, set from "
        "memory=): raise memory= or allocate less"]
    assert ex.submit(tasks.allocate_mib, 10).result(timeout=60) == 10  # the worker lived on
    assert ex.stats().workers_lost == 0


def test_a_memory_limited_worker_has_what_a_threads_exit_needs_loaded(
        make_executor: ExecutorFactory) -> None:
    """glibc loads libgcc_s when a thread first exits: a worker whose task filled its
    address space could not, and aborted. One under a limit loads it as it starts."""
    ex = make_executor(1, memory="2G")
    assert ex.submit(tasks.mapped, "libgcc_s").result(timeout=60)


def test_without_memory_no_limit_is_set(make_executor: ExecutorFactory) -> None:
    import resource

    ex = make_executor(1)
    assert ex.submit(tasks.address_space_limit).result(timeout=60) == resource.getrlimit(
        resource.RLIMIT_AS)
    assert ex.submit(tasks.allocate_mib, 600).result(timeout=60) == 600
    with pytest.raises(MemoryError) as raised:
        ex.submit(tasks.raise_memory_error).result(timeout=60)
    assert not hasattr(raised.value, "__notes__")  # no limit, nothing to say about one


@pytest.mark.parametrize(("program", "memory", "code", "said"), [
    ("bytearray(64 << 20)", 32 << 20, 1, True),  # cannot start under its limit
    ("import ctypes; ctypes.string_at(0)", 1 << 30, -signal.SIGSEGV, True),  # a native crash
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 1 << 30, -signal.SIGTERM,
     False),
    ("pass", 1 << 30, 0, False),
])
def test_a_memory_limited_worker_that_fails_names_the_limit(program: str, memory: int,
                                                            code: int, said: bool) -> None:
    """Unless someone stopped it, or it ended well: then its limit is no part of why."""
    backend = LocalBackend()
    exits: queue.Queue[WorkerStatus] = queue.Queue()
    spec = WorkerSpec(worker_id="w0", executor_id="local-test",
                      command=("python", "-c", program), resources=Resources(memory=memory))
    try:
        handle = backend.start_worker(spec)
        backend.watch(handle, lambda _, status: exits.put(status))
        status = exits.get(timeout=30)
    finally:
        backend.close()
    assert status.exit_code == code
    assert (status.reason is not None and f"memory={memory} bytes (RLIMIT_AS)" in status.reason
            and "raise memory=" in status.reason) is said, status.reason


# -- the forking launcher ----------------------------------------------------------------------
LAUNCHED = """
import os, sys, time
from fiberexec import FiberExecutor
from tests import tasks
ex = FiberExecutor(4)
futures = [ex.submit(tasks.sleep_return, 0.5, i) for i in range(4)]
pids = set()
while len(pids) < 4:
    pids |= {f.result(timeout=60) for f in [ex.submit(tasks.sleep_pid, 0.2) for _ in range(8)]}
print(" ".join(map(str, sorted(pids))), flush=True)
if sys.argv[1:] == ["stuck"]:  # every worker in a C call: none can notice the executor go
    stuck = [ex.submit(tasks.hold_the_gil) for _ in range(4)]
    while ex.stats().tasks_running < 4:
        time.sleep(0.05)
    time.sleep(0.2)
    print("stuck", flush=True)
time.sleep(600)
"""


@pytest.fixture
def no_launcher_yet() -> None:
    """This process's launchers closed (`SharedLaunchers` keeps them for the next executor):
    the test's executor is the first, whose first two workers start afresh."""
    shared_launchers.close_idle()
    assert not shared_launchers.pids(), "a launcher still forks for an executor"


def _executor_program(*args: str) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHED, *args], stdout=subprocess.PIPE,
                            text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.stdout is not None
    pids = [int(pid) for pid in proc.stdout.readline().split()]
    if args == ("stuck",):
        assert proc.stdout.readline() == "stuck\n"
    return proc, pids


def test_workers_are_forked_from_one_launcher_and_go_with_a_killed_executor() -> None:
    import psutil

    executor, pids = _executor_program()
    try:
        workers = [psutil.Process(pid) for pid in pids]
        forked = [w for w in workers if w.ppid() != executor.pid]
        assert len(forked) == 2  # the first two start afresh while the launcher starts
        assert len({w.ppid() for w in forked}) == 1  # one parent for the others
        launcher = forked[0].parent()
        assert launcher is not None and launcher.ppid() == executor.pid
        assert launcher.cmdline()[-4:-1] == ["-m", "fiberexec.worker", "--launcher"]
        executor.kill()  # no shutdown: connections close, the launcher's socket closes
        executor.wait(timeout=30)
        _gone, alive = psutil.wait_procs([launcher, *workers], timeout=15)
        assert not alive, f"left running after the executor was killed: {alive}"
    finally:
        if executor.poll() is None:
            executor.kill()
        executor.communicate(timeout=30)


ONE_AFTER_ANOTHER = """
import json, os, sys
from fiberexec import FiberExecutor
from fiberexec.backend import shared_launchers
from fiberexec.backends import _local_stray
from tests import tasks

def parents(workers):  # each worker's parent; its process shows its ids (for cleanup)
    with FiberExecutor(workers) as ex:
        seen = {}
        for _ in range(40):
            for f in [ex.submit(tasks.sleep_loaded, 0.1, "x") for _ in range(2 * workers)]:
                pid, parent, _loaded = f.result(timeout=60)
                seen[pid] = parent
            if len(seen) == workers:
                shown = {(w.executor_id, w.worker_id) for w in _local_stray.local_workers()
                         if w.pid in seen}
                ids = {(ex.executor_id, w.worker_id) for w in ex.workers()}
                assert shown == ids, (shown, ids)
                return sorted(seen.values())
    raise AssertionError(seen)

report = {"me": os.getpid()}
for name, workers in (("a", 2), ("b", 2), ("c", 4)):
    report[name] = parents(workers)
    report[name + " launchers"] = shared_launchers.pids()
child = os.fork()
if child == 0:  # a forked program starts launchers of its own
    print(json.dumps({"me": os.getpid(), "d": parents(3),
                      "d launchers": shared_launchers.pids()}), flush=True)
    sys.exit(0)
report["child"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
print(json.dumps(report), flush=True)
"""


def test_executors_made_one_after_another_fork_their_workers_from_one_launcher() -> None:
    """A program that makes executors one after another (a pool per generation) gets its
    workers forked at once after the first two executors, as the stdlib's forkserver serves
    a program: the first executor's two workers start afresh and no launcher starts (a
    program with one executor pays for none); the second's first starts afresh, with the
    launcher beside it; every later worker is forked by it, and it ends with the program.
    A process forked from the program starts launchers of its own. A forked worker's
    process names its executor and worker, as a fresh one's does (`fiberexec cleanup`)."""
    import json

    import psutil

    proc = subprocess.run([sys.executable, "-c", ONE_AFTER_ANOTHER], capture_output=True,
                          text=True, timeout=120, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    child, parent = (json.loads(line) for line in proc.stdout.splitlines())
    me = parent["me"]
    assert parent["a"] == [me, me] and parent["a launchers"] == []
    (launcher,) = parent["b launchers"]
    assert me in parent["b"] and set(parent["b"]) <= {me, launcher}
    assert parent["c"] == [launcher] * 4 and parent["c launchers"] == [launcher]
    assert parent["child"] == 0
    assert launcher not in child["d"] and len(child["d launchers"]) == 1
    assert set(child["d"]) <= {child["me"], *child["d launchers"]}
    assert child["d launchers"][0] in child["d"]  # its third worker at least
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == "zombie"


def _loaded_in_each(ex: Any, workers: int, module: str) -> dict[int, tuple[int, bool]]:
    """For each of the executor's ``workers`` workers (by pid): its parent, and whether
    ``module`` was imported in it when it ran a task (rounds of sleeping tasks until each
    of them has run one)."""
    seen: dict[int, tuple[int, bool]] = {}
    for _ in range(20):
        for f in [ex.submit(tasks.sleep_loaded, 0.2, module) for _ in range(2 * workers)]:
            pid, parent, loaded = f.result(timeout=60)
            seen[pid] = (parent, loaded)
        if len(seen) == workers:
            break
    assert len(seen) == workers
    return seen


@pytest.mark.usefixtures("no_launcher_yet")
def test_a_forked_worker_has_what_a_scripts_function_needs_loaded(
        make_executor: ExecutorFactory) -> None:
    """A function of the script travels by value and needs cloudpickle to be rebuilt: the
    launcher imports it once, so hundreds of forked workers do not each import it (about
    12 ms of CPU each) before their first task. (A fresh worker imports it when a task needs
    it: the task here comes from a module, and needs nothing of it.)"""
    seen = _loaded_in_each(make_executor(4), 4, "cloudpickle")
    forked = [loaded for parent, loaded in seen.values() if parent != os.getpid()]
    fresh = [loaded for parent, loaded in seen.values() if parent == os.getpid()]
    assert len(forked) >= 2 and all(forked)  # (the second too, where the launcher runs)
    assert fresh and not any(fresh)


def test_with_modules_to_preload_every_worker_starts_with_them(
        make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first workers of a pool are started fresh, unless modules are to be preloaded:
    then every one is forked by the launcher that imported them, the first two too."""
    monkeypatch.setenv("FIBEREXEC_PRELOAD", "colorsys")  # a module nothing else here imports
    seen = _loaded_in_each(make_executor(2), 2, "colorsys")
    assert all(parent != os.getpid() and loaded for parent, loaded in seen.values())


def test_set_forkserver_preload_makes_processes_start_with_the_modules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_forkserver_preload``, the stdlib's call for its fork server, preloads into the
    launcher: processes started after it begin with the modules imported."""
    import fiberexec.multiprocessing as fmp

    monkeypatch.setenv("FIBEREXEC_PRELOAD", "")  # (what the call sets is undone after)
    with fmp.Pool(1) as pool:
        assert not pool.apply(tasks.imported, ("colorsys",))
    fmp.set_forkserver_preload(["colorsys"])  # a module nothing else here imports
    assert os.environ["FIBEREXEC_PRELOAD"] == "colorsys"
    with fmp.Pool(1) as pool:
        assert pool.apply(tasks.imported, ("colorsys",))
    with pytest.raises(TypeError, match="list of module names"):
        fmp.set_forkserver_preload("colorsys")  # type: ignore[arg-type]
    fmp.set_forkserver_preload([])
    assert "FIBEREXEC_PRELOAD" not in os.environ


_PRELOAD_PROGRAM = """
import importlib, sys
from tests import tasks
mp = importlib.import_module(sys.argv[1])
ctx = mp.get_context("forkserver")
try:
    ctx.set_forkserver_preload(["colorsys", 1])
except TypeError:
    refused = True
else:
    refused = False
if sys.argv[2] == "preload":
    ctx.set_forkserver_preload(["colorsys"])
with ctx.Pool(1) as pool:
    print(refused, pool.apply(tasks.imported, ("colorsys",)))
"""


@pytest.mark.parametrize("module", ["multiprocessing", "fiberexec.multiprocessing"])
@pytest.mark.parametrize("preload", ["preload", "none"])
def test_forkserver_preload_as_the_stdlib_does(module: str, preload: str) -> None:
    """The stdlib's contract, in a fresh program each (its fork server starts once): a name
    that is not a string is refused, and a process started after the call begins with the
    modules imported (without it, not)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    env.pop("FIBEREXEC_PRELOAD", None)
    done = subprocess.run([sys.executable, "-c", _PRELOAD_PROGRAM, module, preload],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(preload == "preload")], done.stderr


def test_what_a_preloaded_module_does_to_the_environment_stays_in_the_launcher(
        make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module the launcher preloads may set, change or remove variables as it is imported:
    a forked worker still has the environment its executor has, as a fresh one would."""
    monkeypatch.setenv("FIBEREXEC_PRELOAD", "tests.env_preload")
    monkeypatch.setenv("FIBEREXEC_TEST_PRELOAD_CHANGED", "the executor's")
    monkeypatch.setenv("FIBEREXEC_TEST_PRELOAD_REMOVED", "the executor's")
    names = ["FIBEREXEC_TEST_PRELOAD_SET", "FIBEREXEC_TEST_PRELOAD_CHANGED",
             "FIBEREXEC_TEST_PRELOAD_REMOVED"]
    ex = make_executor(2)
    assert ex.submit(tasks.imported, "tests.env_preload").result(timeout=60)  # forked
    assert [ex.submit(tasks.getenv, name).result(timeout=60) for name in names] == [
        None, "the executor's", "the executor's"]


def test_a_worker_whose_environment_is_too_large_for_the_launcher_starts_afresh(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork request carries what changed in the environment since the launcher started;
    one larger than its socket takes starts the worker as a new process instead, saying
    why (not that the launcher is gone)."""
    from fiberexec import FiberExecutor

    backend = LocalBackend()
    try:
        with FiberExecutor(3, backend=backend) as ex:  # the third is forked: a launcher runs
            _loaded_in_each(ex, 3, "cloudpickle")
        large = {f"FIBEREXEC_TEST_LARGE_{i}": str(i) * 100_000 for i in range(3)}
        for name, value in large.items():  # (100 kB: a variable's most a process may have)
            monkeypatch.setenv(name, value)
        with caplog.at_level("WARNING", logger="fiberexec"), \
                FiberExecutor(2, backend=backend) as ex:  # each would be forked
            seen = [ex.submit(tasks.getenv, name).result(timeout=60) for name in large]
        assert seen == list(large.values())
        assert "more than the launcher's socket takes" in caplog.text
        assert "launcher is gone" not in caplog.text
    finally:
        backend.close()


def test_cleanup_stops_a_forked_worker_whose_executor_is_gone() -> None:
    """A worker that could not notice its executor's end (stuck in a C call that holds the
    GIL) is found by its executor pid, though its command line and environment are the
    launcher's. (A stopped one is not left: once the launcher, its parent, is gone, its
    process group is orphaned, and the kernel sends a stopped member SIGHUP.)"""
    from fiberexec.backends import _local_stray

    executor, every = _executor_program("stuck")
    pids = [pid for pid in every if _parent(pid) != executor.pid]  # the forked ones
    try:
        live = [w for w in _local_stray.local_workers() if w.pid == pids[0]]
        assert live and not _local_stray.is_stray(live[0], _local_stray.listening_ports())
        executor.kill()
        executor.wait(timeout=30)
        strays = [w for w in _local_stray.stray_local_workers() if w.pid == pids[0]]
        assert len(strays) == 1
        assert _local_stray.terminate(strays[0], grace=0.5)
        assert not os.path.exists(f"/proc/{pids[0]}") or _zombie(pids[0])
    finally:
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if executor.poll() is None:
            executor.kill()
        executor.communicate(timeout=30)


def test_cleanup_names_a_launcher_as_such(make_executor: ExecutorFactory) -> None:
    """`cleanup --all` lists the program's launcher as what it is, not as a worker of
    no known executor."""
    from fiberexec.backend import Sweep, shared_launchers

    _pids_of_all(make_executor(4), 4)  # the first start afresh, the others are forked
    launchers = shared_launchers.pids()
    assert launchers
    lines = LocalBackend.remove_stray(Sweep(everything=True, dry_run=True))
    for launcher in launchers:
        said = [line for line in lines if f"(pid {launcher}:" in line]
        assert said == [f"would remove the worker launcher of program pid {os.getpid()} "
                        f"(pid {launcher}: --all)"], lines


def _launched_parents(mp: Any, count: int, words: str) -> set[int]:
    from tests.mp import tasks as mp_tasks

    out = mp.Queue()
    procs = [mp.Process(target=mp_tasks.say_and_put_parent, args=(out, words))
             for _ in range(count)]
    for proc in procs:
        proc.start()
    parents = {out.get(timeout=60) for _ in procs}
    for proc in procs:
        proc.join(30)
    assert [proc.exitcode for proc in procs] == [0] * count
    return parents


def test_processes_fork_from_one_launcher_that_serves_batch_after_batch(
        capfd: pytest.CaptureFixture[str]) -> None:
    """`fiberexec.multiprocessing` processes are forked by the launcher, which stays for the
    next batch, and for the program after the backend closes (as the stdlib's forkserver);
    a child writes to the stderr its parent has when it starts it, not to the one the
    launcher was started with."""
    import psutil

    import fiberexec.multiprocessing as mp

    backend = LocalBackend()
    mp.set_default_backend(backend)
    try:
        with capfd.disabled():  # the launcher starts with the terminal's stderr
            first = _launched_parents(mp, 2, "first batch")
        second = _launched_parents(mp, 2, "second batch")
        assert first == second and len(first) == 1
        launcher = psutil.Process(first.pop())
        assert launcher.ppid() == os.getpid() and "--launcher" in launcher.cmdline()
        assert capfd.readouterr().err.count("second batch") == 2
    finally:
        mp.set_default_backend(None)
        backend.close()
    assert launcher.pid in shared_launchers.pids()


@pytest.mark.parametrize("system", ["stdlib", "fiberexec"])
def test_a_child_has_its_parents_environment_as_it_is_at_start(
        monkeypatch: pytest.MonkeyPatch, system: str) -> None:
    """A variable set since the first child started reaches the next, one removed since
    does not, one changed has its new value: as with the standard library, and through
    fiberexec's launcher, which was started with the environment of the first."""
    import multiprocessing

    import fiberexec.multiprocessing as fiber_mp
    from tests.mp import tasks as mp_tasks

    mp: Any = fiber_mp if system == "fiberexec" else multiprocessing.get_context("spawn")
    monkeypatch.setenv("FIBEREXEC_TEST_GONE", "first")
    monkeypatch.setenv("FIBEREXEC_TEST_CHANGED", "first")
    backend = LocalBackend()
    fiber_mp.set_default_backend(backend)
    try:
        first = _launched_parents(mp, 1, "the first child")
        monkeypatch.delenv("FIBEREXEC_TEST_GONE")
        monkeypatch.setenv("FIBEREXEC_TEST_CHANGED", "next")
        monkeypatch.setenv("FIBEREXEC_TEST_NEW", "next")
        out = mp.Queue()
        names = ["FIBEREXEC_TEST_GONE", "FIBEREXEC_TEST_CHANGED", "FIBEREXEC_TEST_NEW"]
        proc = mp.Process(target=mp_tasks.put_parent_and_env, args=(out, names))
        proc.start()
        parent, env = out.get(timeout=60)
        proc.join(30)
        assert env == {"FIBEREXEC_TEST_GONE": None, "FIBEREXEC_TEST_CHANGED": "next",
                       "FIBEREXEC_TEST_NEW": "next"}
        if system == "fiberexec":
            assert {parent} == first != {os.getpid()}  # forked by the launcher
    finally:
        fiber_mp.set_default_backend(None)
        backend.close()


def test_a_fork_request_carries_what_differs_from_the_launchers_environment() -> None:
    """What a forked child changes: names set to another value (or new), names removed; a
    name back at the launcher's value needs nothing (the child has it from the fork)."""
    from fiberexec._launcher import environment_delta

    base = {"SAME": "1", "BACK": "launcher's", "CHANGED": "old", "GONE": "x", "EMPTY": ""}
    env = {"SAME": "1", "BACK": "launcher's", "CHANGED": "new", "EMPTY": "", "NEW": "é" * 3}
    changed, removed = environment_delta(base, env)
    assert changed == {"CHANGED": "new", "NEW": "é" * 3}
    assert removed == ["GONE"]
    rebuilt = {name: value for name, value in base.items() if name not in removed}
    assert {**rebuilt, **changed} == env


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_start_that_shutdown_overtakes_is_dropped_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """A task that crashes every worker it runs on leaves a replacement starting (the pool's
    fourth worker, forked by the launcher) while shutdown closes the backend: that start ends
    there, with no warning that the launcher failed and no process started afresh instead."""
    from fiberexec import FiberExecutor, WorkerLostError

    caplog.set_level("INFO", logger="fiberexec")
    with (FiberExecutor(1, backend="local", heartbeat=0.5) as ex,
          pytest.raises(WorkerLostError, match="signal 11")):
        ex.submit(tasks.segfault_after, 0.0).result(timeout=60)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    assert all("SIGSEGV" in message for message in warnings), warnings
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("started")]
    assert len(started) <= 4, started


def _pids_of_all(ex: Any, count: int, seen: set[int] | None = None) -> set[int]:
    """Run short tasks until ``count`` worker processes not in ``seen`` ran one (each round
    waits for its tasks: no sleeping between rounds); bounded by 100 rounds."""
    found: set[int] = set()
    for _ in range(100):
        found |= {f.result(timeout=60) for f in [ex.submit(tasks.sleep_pid, 0.1)
                                                  for _ in range(8)]} - (seen or set())
        if len(found) >= count:
            return found
    raise AssertionError(f"only {len(found)} of {count} workers ran a task: {found}")


@pytest.mark.usefixtures("no_launcher_yet")
def test_a_killed_launcher_is_replaced_and_forks_the_next_worker(
        make_executor: ExecutorFactory, caplog: pytest.LogCaptureFixture) -> None:
    """The launcher killed from outside (its children live on), then a forked worker killed:
    the replacement is forked by a new launcher, not started as a fresh interpreter, and the
    replacement of the launcher is said once, with how the old one ended."""
    import psutil

    caplog.set_level("WARNING", logger="fiberexec")
    ex = make_executor(4)
    pids = _pids_of_all(ex, 4)
    old = [p for p in psutil.Process().children() if "--launcher" in p.cmdline()]
    assert len(old) == 1
    forked = [pid for pid in pids if _parent(pid) == old[0].pid]
    assert len(forked) >= 2  # the first (or two) start afresh
    old[0].kill()  # (not waited for here: its status is the backend's to read)
    os.kill(forked[0], signal.SIGKILL)
    (new_pid,) = _pids_of_all(ex, 1, seen=pids)
    launcher = psutil.Process(_parent(new_pid))
    assert launcher.pid != old[0].pid and "--launcher" in launcher.cmdline()
    assert launcher.ppid() == os.getpid()
    said = [r.getMessage() for r in caplog.records if "launcher" in r.getMessage()]
    assert len(said) == 1 and "killed by signal 9 (SIGKILL)" in said[0], said
    assert "a new one forks the next (replacement 1 of 3)" in said[0]


SESSION = """
import os, sys
from concurrent.futures import ProcessPoolExecutor
from fiberexec import FiberExecutor


def where():
    return os.getsid(0), os.getpgrp()


if __name__ == "__main__":
    os.setpgid(0, 0)  # as a shell starts a job: a group of its own, the terminal's
    Executor = FiberExecutor if sys.argv[1] == "fiberexec" else ProcessPoolExecutor
    with Executor(4) as ex:
        seen = {f.result(timeout=60) for f in [ex.submit(where) for _ in range(8)]}
    print(os.getsid(0), os.getpgrp(), *sorted({group for _sid, group in seen}))
    print(*sorted({sid for sid, _group in seen}))
"""


@pytest.mark.parametrize("system", ["stdlib", "fiberexec"])
def test_workers_run_in_the_callers_session(tmp_path: Any, system: str) -> None:
    """Workers are in the session of the program that made the executor, as the standard
    library's are, so the kernel schedules them as it schedules the stdlib's (Linux's
    autogroup weighs each session as one: a session per worker gave the executor's threads,
    all together, one worker's share). fiberexec's are in groups of their own, out of the
    reach of the terminal's Ctrl-C, which the stdlib's share."""
    script = tmp_path / "session.py"
    script.write_text(SESSION)
    done = subprocess.run([sys.executable, str(script), system], capture_output=True,
                          text=True, timeout=120, check=True)
    mine, workers = done.stdout.splitlines()
    sid, group, *groups = (int(word) for word in mine.split())
    assert [int(word) for word in workers.split()] == [sid]
    if system == "stdlib":
        assert groups == [group]
    else:
        assert group not in groups


TERMINAL = """
import fcntl, os, sys, termios
from concurrent.futures import ProcessPoolExecutor
from fiberexec import FiberExecutor


def hello():
    print("hello from a worker", flush=True)
    return 42


if __name__ == "__main__":
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the terminal is ours, our group its foreground
    Executor = FiberExecutor if sys.argv[1] == "fiberexec" else ProcessPoolExecutor
    with Executor(1) as ex:
        print("result", ex.submit(hello).result(timeout=60), flush=True)
"""


@pytest.mark.parametrize("system", ["stdlib", "fiberexec"])
def test_a_worker_writes_to_a_terminal_that_stops_background_writers(
        tmp_path: Any, system: str) -> None:
    """With ``stty tostop``, a process outside the terminal's foreground group that writes
    to it is stopped (SIGTTOU). A worker is outside it (see above): it writes all the same,
    as the stdlib's do, and its task ends."""
    import pty
    import select
    import termios

    script = tmp_path / "terminal.py"
    script.write_text(TERMINAL)
    master, terminal = pty.openpty()
    attrs = termios.tcgetattr(terminal)
    attrs[3] |= termios.TOSTOP
    termios.tcsetattr(terminal, termios.TCSANOW, attrs)
    proc = subprocess.Popen([sys.executable, str(script), system], stdin=terminal,
                            stdout=terminal, stderr=terminal, start_new_session=True)
    os.close(terminal)
    out = b""
    try:
        while b"result 42" not in out:  # (a read may end anywhere in the line)
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, f"nothing more within 60 s; the terminal showed {out!r}"
            try:
                out += os.read(master, 4096)
            except OSError:  # the terminal closed: every writer has gone
                break
        assert proc.wait(timeout=60) == 0, out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)
    assert b"hello from a worker" in out
    assert b"result 42" in out


def test_env_is_set_in_every_worker(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, env={"OMP_NUM_THREADS": "1", "MY_FLAG": "on"})
    names = ["OMP_NUM_THREADS", "MY_FLAG"] * 20
    assert set(zip(names, ex.map(tasks.getenv, names, timeout=60), strict=True)) == {
        ("OMP_NUM_THREADS", "1"), ("MY_FLAG", "on")}
    assert len({w.worker_id for w in ex.workers()}) == 2


def test_a_workdir_that_is_not_there_is_named(make_executor: ExecutorFactory,
                                              tmp_path: Any) -> None:
    missing = str(tmp_path / "nowhere")
    ex = make_executor(1, workdir=missing)
    with pytest.raises(
            BrokenFiberExecutor, match=rf"its working directory '{missing}' \(the workdir "
                                       r"setting\) is not a directory here"):
        ex.submit(tasks.square, 2).result(timeout=60)


def test_executors_sharing_a_backend_keep_their_own_workers() -> None:
    """Two executors alive at once on one backend both have a ``w0``: the first one's
    shutdown stops its own workers, not the second's, and their exits, reported after the
    second's workers took the ids, neither block the reports of every other worker (they
    did: the launcher's reader waited for the second's ``w0`` to exit) nor count as its."""
    from fiberexec import FiberExecutor

    backend = LocalBackend()
    try:
        first = FiberExecutor(2, backend=backend)
        mine = _pids_of_all(first, 2)
        with FiberExecutor(2, backend=backend) as second:
            theirs = _pids_of_all(second, 2)
            for pid in mine:  # their exits are the first's: it replaces them
                os.kill(pid, signal.SIGKILL)
            _pids_of_all(first, 2, seen=mine)
            first.shutdown(wait=True)
            assert _pids_of_all(second, 2) == theirs  # not one stopped, or replaced
            assert (first.stats().workers_lost, second.stats().workers_lost) == (2, 0)
        with FiberExecutor(3, backend=backend) as third:  # forks are still answered
            assert len(_pids_of_all(third, 3)) == 3
    finally:
        backend.close()


def test_a_forked_workers_exit_is_awaited_on_a_descriptor_past_1024() -> None:
    """With the launcher gone, each forked child's exit is awaited on its pidfd. An
    executor of many workers holds descriptors past 1024, which `select` refuses: such a
    child was reported dead at once, alive. It is reported when it exits."""
    import resource
    import types

    from fiberexec.backend import ForkedProcess, Launcher

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard >= 2048, "this machine allows no fd 1500"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        pidfd = os.pidfd_open(proc.pid)
        high = os.dup2(pidfd, 1500)
        os.close(pidfd)
        child = ForkedProcess(proc.pid, high)
        gone_launcher = types.SimpleNamespace(_children={proc.pid: child})
        waiter = threading.Thread(target=Launcher._await_pidfd,
                                  args=(gone_launcher, proc.pid, child), daemon=True)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and child.poll() is None  # it runs: nothing reported
        assert proc.stdin is not None
        proc.stdin.close()  # it exits
        waiter.join(30)
        assert child.poll() == -signal.SIGKILL  # (the status went to the launcher, gone)
        assert not gone_launcher._children
    finally:
        proc.kill()
        proc.wait(30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_whose_exit_hangs_goes_with_what_it_forked(
        make_executor: ExecutorFactory) -> None:
    """When a worker's exit outlasts the stop's grace, its whole process group is killed:
    a task that left a fork-context pool open left that pool's workers, hung and then
    orphaned, holding the program's stdout (``python prog.py | cat`` never ended)."""
    import psutil

    ex = make_executor(1)
    child = ex.submit(tasks.start_child_then_hang_at_exit).result(timeout=60)
    assert psutil.pid_exists(child)
    ex.shutdown(wait=True)
    try:
        proc = psutil.Process(child)
        proc.wait(timeout=10)  # (killed with the worker: gone at once, or a zombie reaped)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


@pytest.mark.parametrize("kind", ["stdlib", "fiberexec"])
def test_workers_start_with_the_umask_and_limits_the_program_has_then(
        kind: str, make_executor: ExecutorFactory, tmp_path: Any) -> None:
    """Set after the program's first executor (whose start began the launcher that forks
    every later worker), as a stdlib worker has them when it is started."""
    import multiprocessing
    import resource
    from concurrent.futures import ProcessPoolExecutor

    def make() -> Any:
        return (ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                if kind == "stdlib" else make_executor(1))

    with make() as first:
        assert first.submit(abs, -1).result(timeout=60) == 1
    umask = os.umask(0o077)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(files[0], 1000) - 1, files[1]))
        with make() as later:
            seen = later.submit(tasks.new_file_mode_and_files_limit,
                                str(tmp_path / "f")).result(timeout=60)
    finally:
        os.umask(umask)
        resource.setrlimit(resource.RLIMIT_NOFILE, files)
    assert seen == (0o600, min(files[0], 1000) - 1)
