"""What ``fiberexec cleanup`` may remove: one rule, the same on every backend.

Every executor holds a *lease* while it runs, and every worker it starts names that lease
(``fiberexec.lease`` among its labels, or in its environment). A lease is a record on the
engine the workers run on, so anyone who can see the workers can test it, from any process
on any machine, and it lapses by itself when its executor is gone, however it ended:

    local       the executor's pid and start time (``FIBEREXEC_EXECUTOR_PID``)
    docker      a lease container ``fiberexec-lease-<executor>`` whose stdin the executor holds
                open; when its process ends the engine closes that stdin and the container exits
    kubernetes  a ``coordination.k8s.io`` Lease ``fiberexec-lease-<executor>`` the executor renews
    ssh         the wrapper that runs each worker, kept alive by the executor's pings

`Sweep` picks workers by that rule: by default only workers whose lease is *gone*; a worker
whose lease cannot be tested is kept and named. ``executor_id`` picks one executor's workers,
held or not (it is how an owner removes their own); ``everything`` picks every worker and is
the explicit choice the command asks for (``--all``), after saying what it will remove.
"""

from __future__ import annotations

from dataclasses import dataclass

from fiberexec._errors import ConfigurationError

#: Label (or environment variable's meaning) naming the lease a worker's executor holds.
LEASE_LABEL = "fiberexec.lease"


def lease_name(executor_id: str) -> str:
    """The name of the executor's lease object on an engine (container, Lease)."""
    return f"fiberexec-lease-{executor_id}"


@dataclass(frozen=True)
class Sweep:
    """Which workers `Backend.remove_stray` removes, and whether it only says so.

    Args:
        executor_id: only this executor's workers, whether its lease is held or not.
        everything: every worker of the backend, live executors' too.
        dry_run: remove nothing; return the same lines, saying what would be removed.
        namespace: for backends that have namespaces (Kubernetes); others ignore it.
    """

    executor_id: str | None = None
    everything: bool = False
    dry_run: bool = False
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.everything and self.executor_id is not None:
            raise ConfigurationError(
                f"a sweep takes one executor (executor_id={self.executor_id!r}) or everything, "
                "not both; drop one of them")

    def picks(self, executor_id: str, lease_held: bool | None) -> bool:
        """Whether a worker of ``executor_id`` goes; ``lease_held`` None: cannot be tested."""
        if self.everything:
            return True
        if self.executor_id is not None:
            return executor_id == self.executor_id
        return lease_held is False

    def verb(self) -> str:
        """``removed``, or ``would remove`` in a dry run."""
        return "would remove" if self.dry_run else "removed"

    def why(self, lease_held: bool | None) -> str:
        """Why a picked worker goes, for its line."""
        if self.everything:
            return "--all"
        if self.executor_id is not None:
            return "its executor was named"
        return "its executor's lease is gone" if lease_held is False else "asked for"
