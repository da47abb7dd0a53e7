"""Chaos through the executor: pods deleted behind its back cost no task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fiberexec import FiberExecutor
from tests import tasks
from tests.k8s.emulator import Emulator
from tests.support.backend_kubernetes import NAMESPACE


def test_pod_deleted_mid_map_loses_nothing(emu: Emulator, make_backend: Callable[..., Any]) -> None:
    with FiberExecutor(2, backend=make_backend(), heartbeat=0.5) as ex:
        results = ex.map(tasks.sleep_return, [0.05] * 60, range(60), timeout=120)
        assert next(results) == 0  # pods are up and busy
        victim = emu.pods(NAMESPACE, selector="fiberexec=worker")[0]["metadata"]["name"]
        emu.delete_pod(NAMESPACE, victim)
        assert list(results) == list(range(1, 60))
        stats = ex.stats()
    assert stats.workers_lost >= 1 and stats.tasks_failed == 0
