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
        assert next(results) == 0  # a pod is up and busy (the other may still be starting)
        busy = [w.reference for w in ex.workers() if w.state in ("idle", "running")]
        assert busy, ex.workers()
        emu.delete_pod(NAMESPACE, busy[0])
        assert list(results) == list(range(1, 60))
        stats = ex.stats()
    assert stats.workers_lost >= 1 and stats.tasks_failed == 0
