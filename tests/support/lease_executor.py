"""An executor in a process of its own, for ``fiberexec cleanup`` tests that kill it.

    python -m tests.support.lease_executor BACKEND OPTIONS_JSON EXECUTOR_KWARGS_JSON

Starts one worker on BACKEND (``OPTIONS_JSON``: its ``backend_options``), waits for a task's
result (so the worker runs and its lease is held), prints ``ready <executor id>`` and then
keeps the worker until its stdin closes (then shuts down) or it is killed.
"""

from __future__ import annotations

import json
import sys

from fiberexec import FiberExecutor


def main() -> None:
    backend, options, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    with FiberExecutor(1, min_workers=1, backend=backend, backend_options=options,
                       **kwargs) as ex:
        if ex.submit(abs, -1).result(timeout=120) != 1:
            raise SystemExit("the worker answered wrongly")
        print("ready", ex._pool.executor_id, flush=True)  # type: ignore[union-attr]
        sys.stdin.read()


if __name__ == "__main__":
    main()
