"""A real executor's dashboard: off unless asked, started with the pool (never in __init__),
gone at shutdown, and refused by a missing extra at construction."""

from __future__ import annotations

import gc
import importlib.util
import socket
import threading
import weakref
from typing import Any

import pytest

from fiberexec import ConfigurationError, FiberExecutor
from fiberexec._dashboard import split
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.dashboard.conftest import request


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
