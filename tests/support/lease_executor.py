"""An executor in a process of its own, for ``fiberexec cleanup`` tests that kill it.

    python -m tests.support.lease_executor BACKEND OPTIONS_JSON EXECUTOR_KWARGS_JSON

Starts one worker on BACKEND (``OPTIONS_JSON``: its ``backend_options``), waits for a task's
result (so the worker runs and its lease is held), prints ``ready <executor id>`` and then
keeps the worker until its stdin closes (then shuts down) or it is killed.

`executors` starts such processes for a test and ends those still alive afterwards.
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fiberexec import FiberExecutor
from tests.support.procs import reap

ROOT = Path(__file__).resolve().parents[2]
#: A started executor's process and its executor id.
Executor = tuple[subprocess.Popen[str], str]


@contextlib.contextmanager
def executors(backend: str, options: Mapping[str, Any], kwargs: Mapping[str, Any],
              env: Mapping[str, str]) -> Iterator[Callable[[], Executor]]:
    """A function that starts one more executor process (waiting until it is ready); the
    live ones shut down, when the block ends, as their stdin closes."""
    started: list[subprocess.Popen[str]] = []

    def start() -> Executor:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.lease_executor", backend,
             json.dumps(dict(options)), json.dumps(dict(kwargs))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)})
        started.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("ready "), f"the executor did not start: {line!r}"
        return proc, line.split()[1]

    try:
        yield start
    finally:
        for proc in started:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in started:
            reap(proc, 60)
            if proc.stdout is not None:
                proc.stdout.close()


def main() -> None:
    backend, options, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    with FiberExecutor(1, min_workers=1, backend=backend, backend_options=options,
                       **kwargs) as ex:
        if ex.submit(abs, -1).result(timeout=120) != 1:
            raise SystemExit("the worker answered wrongly")
        print("ready", ex.executor_id, flush=True)  # type: ignore[union-attr]
        sys.stdin.read()


if __name__ == "__main__":
    main()
