"""``fiberexec cleanup``: each backend's `Backend.remove_stray` removes jobs whose executor is
gone (local worker processes; containers, pods and Secrets labelled ``fiberexec``).

A backend that is not reachable here (no engine, no cluster, no SDK) is reported as skipped,
never raised: cleanup goes on with the next one.
"""

from __future__ import annotations

from fiberexec.backend import CapabilityError, backend_class, first_line


def cleanup(name: str, executor_id: str | None, namespace: str | None) -> list[str]:
    """Lines saying what ``name``'s ``remove_stray`` did, each prefixed with the backend."""
    try:
        lines = backend_class(name).remove_stray(executor_id, namespace=namespace)
    except CapabilityError:
        lines = ["skipped (the backend has no remove_stray)"]
    except Exception as exc:  # an engine or cluster that is not there is reported, not raised
        lines = [f"skipped ({first_line(exc)})"]
    return [f"{name}: {line}" for line in lines]

