"""Network faults on the test bed, with the ssh backend and TLS on.

Each test names the fault, what users are promised, and checks it end to end: real sshd,
real TCP, links cut in the bridge, loss from nftables, delay from the relay.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, wait
from pathlib import Path
from typing import Any

import psutil
import pytest

from fiberexec import BrokenFiberExecutor, RetryPolicy, TLSOptions
from fiberexec._stats import Stats
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.ssh import SSHBackend, remove_stray
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.ssh import faulttasks
from tests.ssh.conftest import empty_venv
from tests.support.backend_ssh import backend_options, ssh_processes
from tests.testbed.session import ROOT, Lab
from tests.testbed.sshd import _wait_for_line

pytestmark = pytest.mark.chaos
Maker = Callable[..., SSHBackend]
HEARTBEAT = 0.5
SILENCE = 3 * HEARTBEAT  # these tests cut networks: silence is what tells, so keep it short
LOSSY_SILENCE = 8 * HEARTBEAT  # where frames are dropped, not cut (see the loss test)


class Timeline(logging.Handler):
    """When (monotonic) ``fiberexec`` log lines containing ``needle`` appeared; an event set
    once ``count`` of them did."""

    def __init__(self, needle: str, count: int) -> None:
        super().__init__(logging.INFO)
        self.needle, self.count = needle, count
        self.times: list[float] = []
        self.messages: list[str] = []
        self.reached = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.times.append(time.monotonic())
            self.messages.append(record.getMessage())
            if len(self.times) >= self.count:
                self.reached.set()


@pytest.fixture
def timeline() -> Iterator[Callable[[str, int], Timeline]]:
    logger = logging.getLogger("fiberexec")
    level, made = logger.level, []
    logger.setLevel(logging.INFO)

    def watch(needle: str, count: int = 1) -> Timeline:
        made.append(Timeline(needle, count))
        logger.addHandler(made[-1])
        return made[-1]

    yield watch
    for handler in made:
        logger.removeHandler(handler)
    logger.setLevel(level)


def _all_connected(timeline: Callable[[str, int], Timeline], n: int) -> Timeline:
    return timeline("connected (shared memory", n)


def test_host_cut_mid_map_loses_nothing(make_backend: Maker, make_executor: ExecutorFactory,
                                        lab: Lab, tls: TLSOptions,
                                        timeline: Callable[[str, int], Timeline]) -> None:
    """2000 tasks; one worker host's link is cut a fifth of the way in."""
    backend = make_backend(slots=2)
    cut_at: list[float] = []
    at_cut: list[Stats] = []

    def progress(stats: Stats) -> None:
        # On the scheduling thread: nothing moves while the cable is pulled, so the cut
        # lands mid-map, with tasks in flight on the doomed host, however loaded the machine.
        if stats.tasks_done >= 400 and not cut_at:
            lab.cut("w1")
            cut_at.append(time.monotonic())
            at_cut.append(stats)

    connected = _all_connected(timeline, 6)
    lost = timeline("stopped responding", 2)
    ex = make_executor(6, backend=backend, tls=tls, heartbeat=HEARTBEAT,
                       silence_timeout=SILENCE, progress=progress)
    assert ex.submit(tasks.square, 2).result(timeout=60) == 4  # starts all six workers
    assert connected.reached.wait(60), "not every worker connected"
    doomed = [psutil.Process(pid) for host, pid in backend.placements().values()
              if host == lab.site.target("w1")]
    assert len(doomed) == 2
    results: list[int] = []
    mapper = threading.Thread(target=lambda: results.extend(
        ex.map(faulttasks.slow_square, range(2000), timeout=180)))
    try:
        mapper.start()
        assert lost.reached.wait(60), "the lost host was never detected"
    finally:
        lab.heal("w1")  # late results of the old workers may now arrive
    mapper.join(timeout=180)
    assert not mapper.is_alive()
    assert results == [i * i for i in range(2000)]  # all there, right, in order, no duplicate
    detected = max(lost.times) - cut_at[0]
    assert at_cut[0].tasks_done < 2000 - 100
    assert detected <= SILENCE + HEARTBEAT / 4 + 0.25, f"detected after {detected:.2f}s"
    stats = ex.stats()
    assert (stats.workers_lost, stats.tasks_done, stats.tasks_failed) == (2, 2001, 0)
    assert stats.tasks_retried >= 1  # what the lost host held ran elsewhere
    _gone, alive = psutil.wait_procs(doomed, timeout=10)
    assert not alive, f"workers of the cut host still run after the heal: {alive}"


def test_executor_link_cut_ends_every_worker(make_backend: Maker, make_executor: ExecutorFactory,
                                             lab: Lab, tls: TLSOptions,
                                             timeline: Callable[[str, int], Timeline]) -> None:
    backend = make_backend(slots=2, connect_timeout=2.0)
    connected = _all_connected(timeline, 6)
    ex = make_executor(6, backend=backend, tls=tls, heartbeat=HEARTBEAT,
                       silence_timeout=SILENCE, start_retry=RetryPolicy(attempts=2, deadline=4))
    futures = [ex.submit(tasks.sleep_return, 60) for _ in range(6)]
    assert connected.reached.wait(60)
    remote = [p for p in ssh_processes(lab) if p.name() != "ssh"]  # wrappers and workers
    assert len(remote) == 12
    lab.cut("ex")
    cut_at = time.monotonic()
    try:
        _gone, alive = psutil.wait_procs(remote, timeout=10)
        took = time.monotonic() - cut_at
        assert not alive, f"still running 10 s after the executor's host vanished: {alive}"
        ex.shutdown(wait=True, cancel_futures=True)
    finally:
        lab.heal("ex")
    assert all(f.done() for f in futures)
    assert remove_stray(**backend_options(lab)) == []
    print(f"every worker exited {took:.1f}s after the cut")


def test_executor_killed_ends_every_worker(lab: Lab, tls: TLSOptions) -> None:
    options = backend_options(lab, slots=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ssh.executor_program", "6", json.dumps(options),
         str(tls.cert_file), str(tls.key_file)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        proc.stderr = proc.stdout
        _wait_for_line(proc, "ready", 90, "the executor program")
        running = ssh_processes(lab)
        assert len([p for p in running if p.name() != "ssh"]) == 12
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _gone, alive = psutil.wait_procs(running, timeout=10)  # clients, wrappers, workers
        assert not alive, f"still running 10 s after the executor was killed: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert remove_stray(**options) == []
    done = subprocess.run(
        [sys.executable, "-m", "fiberexec", "cleanup", "--backend", "ssh"], cwd=ROOT,
        env={**__import__("os").environ, "FIBEREXEC_BACKEND": "ssh",
             "FIBEREXEC_BACKEND_OPTIONS": json.dumps(options)},
        capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "ssh: no stray workers"


def _map_cleanly(ex: Any, n: int) -> None:
    assert list(ex.map(faulttasks.slow_square, range(n), [0.001] * n, timeout=180)) == [
        i * i for i in range(n)]
    stats = ex.stats()
    assert (stats.workers_lost, stats.tasks_done, stats.tasks_failed) == (0, n, 0)


def test_two_percent_loss_on_every_link(make_backend: Maker, make_executor: ExecutorFactory,
                                        lab: Lab, tls: TLSOptions) -> None:
    """Nothing is cut, so silence need not tell quickly: a frame lost two or three times in a
    row waits out TCP's growing retransmission timeout (0.2 s, then 0.4, 0.8: 1.4 s), which
    at 2% loss each way on each host crossed `SILENCE` now and then and lost a live worker.
    The silence allowed here is past four losses in a row (3 s)."""
    for host in lab.bed.hosts:
        lab.bed.loss(host, 2.0)
    ex = make_executor(6, backend=make_backend(slots=2), tls=tls, heartbeat=HEARTBEAT,
                       silence_timeout=LOSSY_SILENCE)
    _map_cleanly(ex, 1000)


def test_five_ms_delay_each_way(make_backend: Maker, make_executor: ExecutorFactory,
                                lab: Lab, tls: TLSOptions) -> None:
    with lab.delay(0.005):
        ex = make_executor(6, backend=make_backend(slots=2), tls=tls, heartbeat=HEARTBEAT,
                           silence_timeout=SILENCE)
        _map_cleanly(ex, 1000)
        ex.shutdown(wait=True)


def _broken_within(ex: Any, seconds: float) -> tuple[str, float]:
    """Tasks longer than the start timeout, so only a broken executor ends them in time."""
    start = time.monotonic()
    futures = [ex.submit(tasks.sleep_return, seconds) for _ in range(2)]
    done, _ = wait(futures, timeout=seconds, return_when=FIRST_EXCEPTION)
    took = time.monotonic() - start
    errors = [f.exception() for f in done if f.exception() is not None]
    assert errors, f"nothing failed within {seconds}s"
    assert isinstance(errors[0], BrokenFiberExecutor), repr(errors[0])
    return str(errors[0]), took


def _others_still_work(make_backend: Maker, make_executor: ExecutorFactory, lab: Lab,
                       tls: TLSOptions) -> None:
    ex = make_executor(2, backend=make_backend(hosts=[lab.site.target("w1")]), tls=tls)
    assert list(ex.map(tasks.square, range(20), timeout=60)) == [i * i for i in range(20)]


START_TIMEOUT = 20.0


@pytest.mark.parametrize(("bad", "says"), [
    ("fxnobody@10.99.0.13", ["fxnobody@10.99.0.13", "Permission denied", "refused our key"]),
    ({"host": "root@10.99.0.13", "port": 2222},
     ["root@10.99.0.13:2222", "Connection refused", "check that sshd runs there"]),
], ids=["auth-refused", "connection-refused"])
def test_host_refusing_ssh_breaks_with_its_name(
        make_backend: Maker, make_executor: ExecutorFactory, lab: Lab, tls: TLSOptions, *,
        bad: Any, says: list[str]) -> None:
    good = {"host": lab.site.target("w2"), "slots": 1}
    ex = make_executor(2, backend=make_backend(hosts=[good, bad]), tls=tls,
                       start_timeout=START_TIMEOUT, start_retry=RetryPolicy(attempts=3,
                                                                             deadline=8))
    message, took = _broken_within(ex, START_TIMEOUT)
    assert took < START_TIMEOUT, f"broken only after {took:.1f}s"
    assert all(s in message for s in says), message
    _others_still_work(make_backend, make_executor, lab, tls)


def test_python_without_fiberexec_breaks_with_host_and_cause(
        make_backend: Maker, make_executor: ExecutorFactory, lab: Lab, tls: TLSOptions,
        tmp_path: Path) -> None:
    bare = empty_venv(tmp_path / "bare")
    hosts = [{"host": lab.site.target("w2"), "slots": 1},
             {"host": lab.site.target("w3"), "python": bare}]
    ex = make_executor(2, backend=make_backend(hosts=hosts), tls=tls,
                       start_timeout=START_TIMEOUT)
    message, took = _broken_within(ex, START_TIMEOUT)
    assert took < START_TIMEOUT, f"broken only after {took:.1f}s"
    for part in (lab.site.target("w3"), bare, "cannot import fiberexec", "No module named"):
        assert part in message, message
    _others_still_work(make_backend, make_executor, lab, tls)


class CountingSSH(SSHBackend):
    """An SSHBackend that notes when each start began."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.starts: list[float] = []

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        self.starts.append(time.monotonic())
        return super().start_worker(spec)


def test_every_host_cut_mid_map_breaks_soon_and_starts_nothing_more(
        make_executor: ExecutorFactory, lab: Lab, tls: TLSOptions,
        timeline: Callable[[str, int], Timeline]) -> None:
    """Every worker host's link is cut mid-map (ssh's own connect timeout, 10 s): the map
    raises within 20 s of the cut (so of the last worker's loss), naming why no worker could
    start; the executor starts nothing after it broke, and its shutdown takes under 5 s."""
    hosts = [name for name in lab.bed.hosts if name != "ex"]
    backend = CountingSSH(**backend_options(lab, slots=2, connect_timeout=10.0))
    cut_at: list[float] = []

    def progress(stats: Stats) -> None:  # on the scheduling thread: the cut lands mid-map
        if stats.tasks_done >= 400 and not cut_at:
            for host in hosts:
                lab.cut(host)
            cut_at.append(time.monotonic())

    connected = _all_connected(timeline, 6)
    lost = timeline("stopped responding", 1)
    broke = timeline("every worker was lost", 1)
    ex = make_executor(6, backend=backend, tls=tls, heartbeat=HEARTBEAT,
                       silence_timeout=SILENCE, progress=progress)
    raised: list[tuple[float, BaseException]] = []

    def run_map() -> None:
        try:
            list(ex.map(faulttasks.slow_square, range(20000), timeout=300))
        except BaseException as exc:  # what the map raised, and when
            raised.append((time.monotonic(), exc))

    try:
        assert ex.submit(tasks.square, 2).result(timeout=60) == 4
        assert connected.reached.wait(60), "not every worker connected"
        mapper = threading.Thread(target=run_map)
        mapper.start()
        mapper.join(timeout=240)
        assert not mapper.is_alive(), "the map never returned"
        assert cut_at and raised, "the map finished although every host was cut"
        raised_at, error = raised[0]
        after_cut = raised_at - cut_at[0]  # the last loss comes after the cut: a stricter bound
        print(f"losses seen {[round(t - cut_at[0], 1) for t in lost.times]}s after the cut "
              f"(by silence; others by their ssh session's end); the map raised "
              f"{after_cut:.1f}s after the cut")
        assert isinstance(error, BrokenFiberExecutor), repr(error)
        assert "could be started" in str(error) and "ssh host" in str(error), str(error)
        assert after_cut <= 20.0, f"the map raised {after_cut:.1f}s after every host was cut"
        assert broke.reached.is_set()
        late = [t for t in backend.starts if t > broke.times[0]]
        began = time.monotonic()
        ex.shutdown(wait=True)
        took = time.monotonic() - began
        print(f"shutdown took {took:.1f}s; {len(late)} starts began after the executor broke")
        assert late == [], f"{len(late)} starts began after the executor broke"
        assert took <= 5.0, f"shutdown of the broken executor took {took:.1f}s"
    finally:
        for host in hosts:
            lab.heal(host)
        backend.close()
