"""``fiberexec cleanup``: each backend's `Backend.remove_stray` removes the workers a `Sweep`
picks: by default those whose executor's lease is gone (see ``fiberexec._sweep``), one
executor's with ``--executor ID``, every worker with ``--all``.

``--all`` removes live executors' workers too, so it first prints what it will remove (a dry
run of the same sweep). A backend that is not reachable here (no engine, no cluster, no SDK)
is reported as skipped, never raised: cleanup goes on with the next one.
"""

from __future__ import annotations

from dataclasses import replace

from fiberexec.backend import CapabilityError, Sweep, backend_class, first_line


def cleanup(name: str, sweep: Sweep) -> list[str]:
    """Lines saying what ``name``'s ``remove_stray`` did, each prefixed with the backend."""
    try:
        lines = backend_class(name).remove_stray(sweep)
    except CapabilityError:
        lines = ["skipped (the backend has no remove_stray)"]
    except Exception as exc:  # an engine or cluster that is not there is reported, not raised
        lines = [f"skipped ({first_line(exc)})"]
    return [f"{name}: {line}" for line in lines]


def run(names: list[str], sweep: Sweep) -> list[str]:
    """Every line of a sweep over ``names``; ``--all`` says what it will remove first."""
    lines: list[str] = []
    if sweep.everything and not sweep.dry_run:
        lines.append("--all removes every fiberexec worker, live executors' too; it will remove:")
        for name in names:
            lines += [f"  {line}" for line in cleanup(name, replace(sweep, dry_run=True))]
    for name in names:
        lines += cleanup(name, sweep)
    return lines
