"""Attach to executors running on this machine: what ``fiberexec top`` reads.

An executor made with ``observe=True`` (or ``FIBEREXEC_OBSERVE=1``) serves snapshots of its
workers on a loopback endpoint, guarded by a token in a file only its user can read, under
``$XDG_RUNTIME_DIR/fiberexec/`` (else ``~/.cache/fiberexec/executors/``)::

    from fiberexec.observe import list_executors, snapshot

    for entry in list_executors():
        print(entry.executor_id, entry.program, len(snapshot(entry)["workers"]))

A snapshot is a JSON object: ``executor_id``, ``pid``, ``time``, ``backend``, ``max_workers``,
``stats`` (the fields of `fiberexec.Stats`), ``throughput`` (tasks per second over the last
``window`` seconds: 10, or since the first submit if that is sooner), ``workers`` (the
fields of `fiberexec.WorkerInfo`), ``medians`` (each function's median run time, seconds,
over the spans kept), ``spans`` (`fiberexec.TaskSpan` fields, those that ended after
``since``; none when ``since`` is 0) and ``failures`` (the last 10, `fiberexec.FailureInfo`
fields).
"""

from __future__ import annotations

from fiberexec._control import ExecutorEntry, list_executors, runtime_dir, snapshot

__all__ = ["ExecutorEntry", "list_executors", "runtime_dir", "snapshot"]
