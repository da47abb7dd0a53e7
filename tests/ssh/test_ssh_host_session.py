"""One SSH session per host: many workers there share one ssh client, wrapper and launcher."""

from __future__ import annotations

import signal
from collections.abc import Callable

import psutil
import pytest

from fiberexec.backend import (
    ENV_PRELOAD,
    WORKER_COMMAND,
    WorkerHandle,
    WorkerSpec,
    WorkerState,
    WorkerStatus,
)
from fiberexec.backends import _ssh_remote as remote
from fiberexec.backends.ssh import PING_INTERVAL, WATCHDOG_SLACK, SSHBackend
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_ssh import finished, spec, ssh_processes
from tests.testbed.session import Lab

Maker = Callable[..., SSHBackend]
SLEEP = "import time; time.sleep(600)"


def on_host(handle: WorkerHandle) -> psutil.Process:
    return psutil.Process(int(handle.ref.rsplit("#", 1)[1]))  # one machine: pids are shared


def clients(lab: Lab) -> list[psutil.Process]:
    return [p for p in ssh_processes(lab) if p.name() == "ssh"]


def test_workers_on_one_host_share_one_session_and_one_launcher(
        make_backend: Maker, make_executor: ExecutorFactory, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w1")], slots=None)
    ex = make_executor(6, backend=backend)
    pids = set(ex.map(tasks.sleep_return, [1.0] * 6, [0] * 6))
    assert pids == {0}
    placed = backend.placements()
    assert len(placed) == 6, placed
    sessions = backend.sessions()
    assert list(sessions) == [lab.site.target("w1")]
    assert [p.pid for p in clients(lab)] == list(sessions.values())
    parents = {psutil.Process(pid).parent() for _host, pid in placed.values()}
    assert len(parents) == 1  # every worker forked by the one launcher there
    launcher = parents.pop()
    assert launcher is not None and "--launcher" in launcher.cmdline()
    wrapper = launcher.parent()
    assert wrapper is not None and remote.HOST_MARK in wrapper.cmdline()


def test_the_hosts_launcher_preloads_what_the_executors_environment_names(
        make_backend: Maker, make_executor: ExecutorFactory, lab: Lab,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PRELOAD, "colorsys")  # a module nothing else here imports
    ex = make_executor(3, backend=make_backend(hosts=[lab.site.target("w1")], slots=None))
    assert list(ex.map(tasks.imported, ["colorsys"] * 3)) == [True] * 3
    assert ex.submit(tasks.imported, "wave").result(timeout=60) is False


def test_the_last_worker_gone_closes_the_hosts_session(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w2")], slots=None)
    handles = [backend.start_worker(spec(f"c{i}", SLEEP)) for i in range(3)]
    (client,) = clients(lab)
    backend.stop(handles[0], grace=5)
    assert backend.sessions() == {lab.site.target("w2"): client.pid}
    for handle in handles[1:]:
        backend.stop(handle, grace=5)
    gone, _ = psutil.wait_procs([client], timeout=30)
    assert gone and backend.sessions() == {}


def test_a_worker_killed_on_the_host_is_reported_its_siblings_run_on(
        make_backend: Maker, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w3")], slots=None)
    handles = [backend.start_worker(spec(f"k{i}", SLEEP)) for i in range(3)]
    on_host(handles[1]).send_signal(signal.SIGKILL)
    assert finished(backend, handles[1]) == WorkerStatus(WorkerState.EXITED, exit_code=-9)
    for handle in (handles[0], handles[2]):
        assert backend.status(handle).state is WorkerState.RUNNING
        assert on_host(handle).status() != psutil.STATUS_ZOMBIE
    assert len(clients(lab)) == 1


def test_a_forked_worker_reports_its_exit_code_and_output(make_backend: Maker,
                                                          lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w1")], slots=None)
    spec = WorkerSpec(worker_id="f1", executor_id="t", command=WORKER_COMMAND)
    handle = backend.start_worker(spec)  # no executor address: the program fails at once
    status = finished(backend, handle)
    assert status == WorkerStatus(WorkerState.EXITED, exit_code=1)
    assert "FIBEREXEC_ADDRESS" in backend.logs(handle)


def test_killing_the_ssh_client_ends_every_worker_of_its_host(make_backend: Maker,
                                                              lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w2")], slots=None)
    handles = [backend.start_worker(spec(f"s{i}", SLEEP)) for i in range(4)]
    jobs = [on_host(h) for h in handles]
    (client,) = clients(lab)
    client.kill()  # as when the executor's process is killed
    watchdog = 30 + WATCHDOG_SLACK + 3 * PING_INTERVAL  # the wrapper's longest wait
    gone, alive = psutil.wait_procs(jobs, timeout=watchdog)
    assert gone and not alive, "workers outlived their host's SSH session"
    for handle in handles:
        assert finished(backend, handle).reason is not None


def test_logs_stay_per_worker(make_backend: Maker, lab: Lab) -> None:
    backend = make_backend(hosts=[lab.site.target("w3")], slots=None)
    code = "import sys; print('I am', sys.argv[1])"
    handles = [backend.start_worker(WorkerSpec(
        worker_id=f"l{i}", executor_id="t", command=("python", "-c", code, f"job-{i}")))
        for i in range(3)]
    for i, handle in enumerate(handles):
        assert finished(backend, handle).exit_code == 0
        lines = backend.logs(handle)
        assert f"I am job-{i}\n" in lines
        assert all(f"job-{j}" not in lines for j in range(3) if j != i), lines
