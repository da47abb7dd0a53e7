"""A real executor's dashboard: off unless asked, started with the pool (never in __init__),
gone at shutdown, and refused by a missing extra at construction."""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import socket
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

from fiberexec import ConfigurationError, FiberExecutor
from fiberexec._dashboard import split
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.dashboard.conftest import request
from tests.test_observe import held


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fiberexec-dashboard"]


def _address(url: str) -> tuple[str, int]:
    return split(url.split("/")[2])


def _refused(url: str) -> bool:
    try:
        socket.create_connection(_address(url), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def test_off_by_default_nothing_listens(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1)
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    assert ex.dashboard_url is None and not _threads()


def test_it_starts_with_the_pool_and_stops_at_shutdown(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, dashboard=True)
    assert not _threads()  # __init__ binds nothing and starts no thread
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    (thread,) = _threads()
    url = ex.dashboard_url
    assert url is not None and url.startswith("http://127.0.0.1:") and "/?token=" in url
    assert request(url).status == 200
    ex.shutdown(wait=True)
    assert not thread.is_alive() and _refused(url)
    assert ex.dashboard_url is None


def test_it_serves_until_a_shutdown_waiting_for_a_task_has_ended(
        make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, dashboard=True)
    with held() as (args, started, release):
        future = ex.submit(tasks.hold_until, *args)
        assert started.poll(30), "the task did not start"
        url = ex.dashboard_url
        assert url is not None
        closing = threading.Thread(target=ex.shutdown)
        closing.start()
        assert ex.dashboard_url == url and request(url).status == 200
        release.send(None)
        future.result(timeout=30)
        closing.join(timeout=60)
    assert not closing.is_alive() and ex.dashboard_url is None and _refused(url)


def test_asking_for_the_address_first_starts_no_worker(make_executor: ExecutorFactory) -> None:
    ex = make_executor(2, dashboard="127.0.0.1:0")
    url = ex.dashboard_url
    assert url is not None and request(url).status == 200
    assert ex.workers() == [] and ex.stats().workers_starting == 0
    assert ex.dashboard_url == url  # one server, asked twice
    ex.shutdown(wait=True)
    assert _refused(url) and not _threads()


def test_the_environment_turns_it_on(
    make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIBEREXEC_DASHBOARD", "on")
    ex = make_executor(1)
    url = ex.dashboard_url
    assert url is not None and request(url).status == 200
    assert request(url.split("?")[0]).status == 403


def test_an_executor_dropped_without_shutdown_stops_its_dashboard(
    make_executor: ExecutorFactory,
) -> None:
    ex: FiberExecutor | None = FiberExecutor(1, dashboard=True)
    assert ex is not None
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    (thread,) = _threads()
    url = ex.dashboard_url
    assert url is not None
    gone = weakref.ref(ex)
    ex = None
    gc.collect()
    assert gone() is None  # the server held it weakly
    thread.join(30)
    assert not thread.is_alive() and _refused(url)


def test_a_missing_extra_is_refused_at_construction_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "aiohttp" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigurationError,
                       match=r"dashboard= needs aiohttp.*pip install 'fiberexec\[dashboard\]'"):
        FiberExecutor(1, dashboard=True)
    assert not _threads()


def test_an_unknown_worker_is_named_once(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, dashboard=True)
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    url = ex.dashboard_url
    assert url is not None
    token = url.split("?token=")[1]
    reply = request(url.split("?")[0] + "api/workers/w99/stack", method="POST",
                    headers={"Authorization": f"Bearer {token}"})
    assert reply.status == 404
    assert reply.body.decode().startswith("no worker 'w99' in this executor; connected workers: ")
    assert reply.body.decode().count("w99") == 1


PROGRAM = ("from fiberexec import FiberExecutor\n"
           "with FiberExecutor(1{}) as ex:\n"
           "    print(ex.submit(abs, -3).result(timeout=60))\n")


def test_a_dashboard_the_environment_turned_on_prints_its_address(tmp_path: Path) -> None:
    """An unchanged program does not print dashboard_url: the executor says where it is."""
    env = {**os.environ, "FIBEREXEC_DASHBOARD": "on"}
    done = subprocess.run([sys.executable, "-c", PROGRAM.format("")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=True)
    [line] = [x for x in done.stderr.splitlines() if "dashboard" in x]
    assert re.fullmatch(r"fiberexec: dashboard at http://127\.0\.0\.1:\d+/\?token=\S{40,}",
                        line)
    quiet = subprocess.run([sys.executable, "-c", PROGRAM.format(", dashboard=True")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
                           env={k: v for k, v in os.environ.items() if k != "FIBEREXEC_DASHBOARD"})
    assert "dashboard" not in quiet.stderr  # the program has dashboard_url to print itself


def test_an_idle_workers_stack_says_it_is_idle(make_executor: ExecutorFactory) -> None:
    ex = make_executor(1, dashboard=True)
    assert ex.submit(tasks.square, 3).result(timeout=60) == 9
    (worker,) = ex.workers()
    stack = ex.dump_stack(worker.worker_id)
    assert "idle, waiting for a task" in stack and "running the task" not in stack
