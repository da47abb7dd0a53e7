"""Local-backend specifics: collected only when the suite runs on the local backend.

(Docker and Kubernetes have their own external-kill chaos tests: ``docker kill`` and a pod
deleted mid-map.)
"""

from __future__ import annotations

import os
import signal

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
