"""``fiberexec cleanup``: each backend's `Backend.remove_stray` removes the workers a `Sweep`
picks: by default those whose executor's lease is gone (see ``fiberexec._sweep``), one
executor's with ``--executor ID``, every worker with ``--all``.

``--executor`` takes a unique start of an id, and refuses an executor whose lease is held
(it runs, and would start new workers at once) unless ``--force``: a `Census` asks the
backends which executors they see and whether each holds its lease. ``--all`` removes live
executors' workers too, so it first prints what it will remove (a dry run of the same sweep)
and asks (see ``_cli.cmd_cleanup``). A backend that is not reachable here (its probe says so;
no engine, no cluster, no SDK) is reported as skipped, never raised: cleanup goes on with the
next one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from fiberexec.backend import (
    Backend,
    CapabilityError,
    ConfigurationError,
    Sweep,
    backend_class,
    first_line,
)


def cleanup(name: str, sweep: Sweep, failed: list[str] | None = None) -> list[str]:
    """Lines saying what ``name``'s ``remove_stray`` did, each prefixed with the backend;
    ``failed`` gets ``name`` if that raised (a backend its probe calls not set up here, or
    unreachable, has nothing to clean up: skipped, not failed)."""
    try:
        cls = backend_class(name)
        why = unreachable(cls)
        lines = [f"skipped (unreachable: {why})"] if why else cls.remove_stray(sweep)
    except CapabilityError:
        lines = ["skipped (the backend has no remove_stray)"]
    except Exception as exc:  # an engine or cluster that is not there is reported, not raised
        lines = [f"skipped ({first_line(exc)})"]
        if failed is not None:
            failed.append(name)
    return [f"{name}: {line}" for line in lines]


def unreachable(cls: type[Backend]) -> str | None:
    """Why the backend says it is not usable here (its `Backend.probe`); None if it is, or
    has no probe. A backend not set up here has no workers to judge (slurm without a
    controller would say it cannot tell live executors' jobs from gone ones')."""
    try:
        found = cls.probe()
    except CapabilityError:
        return None
    return None if found.usable else found.detail


def run(names: list[str], sweep: Sweep, failed: list[str] | None = None) -> Iterator[str]:
    """Every line of a sweep over ``names``, as each backend finishes (see `cleanup`)."""
    for name in names:
        yield from cleanup(name, sweep, failed)


def listing(names: list[str], sweep: Sweep) -> Iterator[str]:
    """What ``--all`` will remove: the lines of the same sweep, dry."""
    yield "--all removes every fiberexec worker, live executors' too; it will remove:"
    for name in names:
        yield from (f"  {line}" for line in cleanup(name, replace(sweep, dry_run=True)))


@dataclass(frozen=True)
class Census(Sweep):
    """A dry sweep that picks nothing: it notes each executor whose workers a backend judged
    (`Sweep.picks`), and whether their lease was held. Backends that hold no lease (slurm) or
    judge on the far side (ssh hosts) tell it nothing."""

    seen: dict[str, set[bool | None]] = field(default_factory=dict)

    def picks(self, executor_id: str, lease_held: bool | None) -> bool:
        if executor_id:
            self.seen.setdefault(executor_id, set()).add(lease_held)
        return False


def survey(names: list[str], namespace: str | None) -> dict[str, set[bool | None]]:
    """The executors ``names`` see workers of, and whether each one's lease is held."""
    census = Census(dry_run=True, namespace=namespace)
    for name in names:
        cleanup(name, census)  # its lines say nothing: what it saw is in the census
    return census.seen


def pick_executor(wanted: str, seen: dict[str, set[bool | None]], *, force: bool) -> str:
    """The executor ``--executor wanted`` names: that id, or the one id it is the start of.

    An id no backend reported is taken as given (a backend that cannot be surveyed may know it).

    Raises:
        ConfigurationError: ``wanted`` starts several ids, or names an executor that still
            runs (its lease is held) and ``force`` is false.
    """
    matches = [wanted] if wanted in seen else sorted(e for e in seen if e.startswith(wanted))
    if len(matches) > 1:
        raise ConfigurationError(
            f"--executor {wanted!r} is the start of {len(matches)} executors' ids: "
            f"{', '.join(matches)}; give more of the id")
    chosen = matches[0] if matches else wanted
    if True in seen.get(chosen, set()) and not force:
        raise ConfigurationError(
            f"executor {chosen} is still running (its lease is held): it would start new "
            "workers as soon as these were removed; stop the program that runs it (Ctrl-C, "
            "or end its process), or pass --force to remove its workers anyway")
    return chosen
