"""Shared fixtures: the backend under test, executors that always shut down, a leak check.

``FIBEREXEC_TEST_BACKEND`` (default ``local``) picks the backend; the same behaviour suite
runs unchanged against each (see tests/support/README.md).
"""

from __future__ import annotations

import faulthandler
import functools
import gc
import importlib
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from fiberexec import FiberExecutor
from fiberexec.backend import Backend
from tests.support.kit import BackendKit

BACKEND = os.environ.get("FIBEREXEC_TEST_BACKEND", "local")
# The stdlib side of the parametrized tests starts its processes as Python 3.14 does on Linux:
# "fork" in this process (full of executor and nng threads) can copy a lock another thread
# holds, and the child then aborts or hangs; that is the stdlib's own hazard, not a contract.
multiprocessing.set_start_method("forkserver", force=True)
# A backend's own adapter tests are collected only in its tox env, so no env reports skips.
_ONLY_ON = {"k8s": "kubernetes", "docker": "docker", "slurm": "slurm",
            "test_local_backend.py": "local", "ssh": "ssh", "testbed": "ssh",
            "stdlib_suite": "local"}
collect_ignore = [path for path, name in _ONLY_ON.items() if name != BACKEND]
# The dashboard's tests need its extra and a real Chromium: collected in the dashboard env,
# where a missing browser fails them, so no env reports them as skipped.
if not os.environ.get("FIBEREXEC_TEST_DASHBOARD"):
    collect_ignore.append("dashboard")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Bound every teardown by the suite's timeout: pytest-timeout stops timing a test whose
    call failed (its issue 196), and a teardown that then hangs would hold the run without
    end. Past the limit: every thread's traceback, then the run ends."""
    watchdog = threading.Timer(float(item.config.getini("timeout")), _teardown_hung, (item,))
    watchdog.daemon = True
    watchdog.start()
    try:
        return (yield)
    finally:
        watchdog.cancel()


def _teardown_hung(item: pytest.Item) -> None:
    capture = item.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    print(f"\n+++ teardown of {item.nodeid} hung: every thread's stack +++", file=sys.stderr,
          flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(1)


@pytest.fixture(scope="session")
def kit() -> Iterator[BackendKit]:
    module = importlib.import_module(f"tests.support.backend_{BACKEND}")
    with module.backend_session() as session_kit:
        yield session_kit


# pytest-xdist runs the local env's files in two processes at once (`tox.ini`): each sees
# the other's files appear in /dev/shm. There a test's check counts only what this process's
# executors named (and what its live processes named); `pytest_sessionfinish` then checks
# the whole of /dev/shm once every process has finished.
_XDIST = "PYTEST_XDIST_WORKER" in os.environ
_EXECUTORS_HERE: set[str] = set()  # ids of the executors built in this process (`_XDIST`)
_SHM_AT_START: set[str] = set()
_SEM_PREFIX = "sem."  # glibc's prefix of a named semaphore's file


def _owner_elsewhere(name: str, ours: set[int]) -> bool:
    """Whether a file names a live creator outside this process's tree (``fiberexec-mp<pid>-``,
    ``fiberexec-joblib-<pid>-``, a kernel semaphore's ``sem.fiberexec-mp<pid>-``) or, under
    xdist, an executor not built here."""
    name = name.removeprefix(_SEM_PREFIX)
    for prefix in ("fiberexec-mp", "fiberexec-joblib-"):
        creator = name.removeprefix(prefix).split("-", 1)[0]
        if name.startswith(prefix) and creator.isdigit():
            return int(creator) not in ours and psutil.pid_exists(int(creator))
    executor = name.removeprefix("fiberexec-").split("-", 1)[0]
    return _XDIST and executor not in _EXECUTORS_HERE


def _shm_files(release: bool = False) -> set[str]:
    """fiberexec's files in /dev/shm (shared memory, and the kernel semaphores of its locks),
    less those of live processes outside this test run; with ``release``, after what this
    process dropped is freed (`_release_dropped`).

    /dev/shm is the machine's: a file whose name says its creator is alive and not of this
    run belongs to another program, not to a test's leak.
    """
    if release:
        _release_dropped()
    ours = {os.getpid()} | {c.pid for c in psutil.Process().children(recursive=True)}
    shm = Path("/dev/shm")
    found = [*shm.glob("fiberexec-*"), *shm.glob(f"{_SEM_PREFIX}fiberexec-*")]
    return {path.name for path in found if not _owner_elsewhere(path.name, ours)}


def _release_dropped() -> None:
    """Free what this process dropped: its handles in reference cycles are collected, and
    their releases, which a thread sends, are in before /dev/shm is read."""
    gc.collect()
    proxies = sys.modules.get("fiberexec.multiprocessing._proxies")
    if proxies is not None:  # (else this process made no handle)
        proxies._releaser.flush()


def pytest_sessionstart(session: pytest.Session) -> None:
    if _XDIST:  # each executor this process builds is named, for `_owner_elsewhere`
        built = FiberExecutor.__init__

        @functools.wraps(built)  # (its signature is read: the joblib backend's options)
        def recording(self: FiberExecutor, *args: Any, **kwargs: Any) -> None:
            built(self, *args, **kwargs)
            _EXECUTORS_HERE.add(self.executor_id)

        FiberExecutor.__init__ = recording  # type: ignore[method-assign]
    elif not hasattr(session.config, "workerinput"):
        _SHM_AT_START.update(_shm_files(release=True))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under xdist (on the controller, after every process ended): nothing left in /dev/shm
    that was not there at the start. (Without xdist, each test's check has seen it all.)"""
    if _XDIST or hasattr(session.config, "workerinput") or not _uses_xdist(session.config):
        return
    stray = _shm_files(release=True) - _SHM_AT_START
    if stray:
        print(f"\nthe tests left shared-memory files in /dev/shm: {sorted(stray)}",
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _uses_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None))


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any test that leaves a worker, container, pod or shared-memory file behind."""
    shm_before = _shm_files()
    yield
    session_kit: BackendKit | None = (
        request.getfixturevalue("kit") if "kit" in request.fixturenames else None
    )
    from tests.support.backend_local import _leaks

    leaked = _leaks() + (session_kit.leaks() if session_kit and BACKEND != "local" else [])
    assert not leaked, f"test left these running: {leaked}"
    stray = _shm_files() - shm_before
    if stray:  # judged once what the test dropped is freed (a collection costs a test run
        stray = _shm_files(release=True) - shm_before  # minutes: only when it may matter)
    assert not stray, f"test left shared-memory files in /dev/shm: {sorted(stray)}"


ExecutorFactory = Callable[..., FiberExecutor]


@pytest.fixture
def make_executor(kit: BackendKit) -> Iterator[ExecutorFactory]:
    """Build executors on the backend under test; all are shut down after the test."""
    made: list[FiberExecutor] = []
    backends: list[Backend] = []

    def make(max_workers: int | None = 2, **kwargs: Any) -> FiberExecutor:
        options = {**kit.executor_kwargs, **kwargs}
        if "backend" not in options:
            backends.append(kit.make_backend())
            options["backend"] = backends[-1]
        options.setdefault("heartbeat", 0.5)
        ex = FiberExecutor(max_workers, **options)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown(wait=True, cancel_futures=True)
    for backend in backends:  # an executor closes only backends it made itself
        backend.close()


@pytest.fixture
def executor(make_executor: ExecutorFactory) -> FiberExecutor:
    """A two-worker executor on the backend under test."""
    return make_executor(2)


class LogEvent(logging.Handler):
    """Set an event once ``count`` records of the ``fiberexec`` logger contain ``needle``."""

    def __init__(self, needle: str, count: int = 1) -> None:
        super().__init__(logging.INFO)
        self.needle, self.count, self.seen = needle, count, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.count -= 1
            if self.count <= 0:
                self.seen.set()


@pytest.fixture
def log_event() -> Iterator[Callable[[str, int], threading.Event]]:
    """``log_event("connected", 2).wait(timeout)``: wait for log lines, not for time."""
    logger = logging.getLogger("fiberexec")
    handlers: list[LogEvent] = []
    level = logger.level
    logger.setLevel(logging.INFO)

    def watch(needle: str, count: int = 1) -> threading.Event:
        handler = LogEvent(needle, count)
        handlers.append(handler)
        logger.addHandler(handler)
        return handler.seen

    yield watch
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)
