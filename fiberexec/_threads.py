"""How many threads a worker's numerical libraries start: its share of the CPUs.

OpenBLAS, MKL, OpenMP and the like start a thread per core in every process that loads
them, and each waits busily for the others. Two workers on two cores then run four BLAS
threads: tasks of 300 x 300 matrix products took 3x as long as with one thread each
(`benchmarks/`' ``matmul`` row; the standard library's workers do the same). So, as loky
does for joblib, each worker is told its share: the ``cpu=`` it was given, else, where
every worker runs on this host, this host's CPUs divided among ``max_workers``; elsewhere
nothing is said (a worker does not know how many others share its node). The executor
passes the number in ``FIBEREXEC_THREADS`` (`fiberexec._contract`); the worker sets each of
`VARIABLES` to it before anything of the user's is imported, unless one of them is set
already (by ``env=``, or inherited): then the user is in charge and none is set.

A worker forked by the launcher (`fiberexec._launcher`) gets its share too, for what it
imports itself; a library the launcher had imported before the fork (what workers needed
before it, ``FIBEREXEC_PRELOAD``) was set up there and keeps the launcher's own threads,
as a stdlib child forked from a parent that had imported it keeps the parent's. (The
launcher also forks `fiberexec.multiprocessing.Process` children, which are told nothing,
as a stdlib child is not.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from fiberexec._contract import ENV_THREADS

#: What the numerical libraries read (joblib's list, as it tells loky's workers).
VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def share(cpu: float | None, max_workers: int, on_this_host: bool) -> int | None:
    """A worker's threads: ``cpu`` (whole CPUs, at least one) if given, else this host's
    CPUs shared among ``max_workers`` when they all run here; None: nothing to say."""
    if cpu is not None:
        return max(1, int(cpu))
    if on_this_host:
        return max(1, cpus() // max(1, max_workers))
    return None


def apply(environ: MutableMapping[str, str], threads: str | int | None) -> list[str]:
    """Set every `VARIABLES` name in ``environ`` to ``threads``, unless it is None or
    empty, or one of them is set already; the names set."""
    if threads is None or threads == "" or any(name in environ for name in VARIABLES):
        return []
    for name in VARIABLES:
        environ[name] = str(threads)
    return list(VARIABLES)


def limit(environ: MutableMapping[str, str]) -> dict[str, str]:
    """`apply` the share ``environ`` names (``FIBEREXEC_THREADS``) to it; the thread
    variables it has then (what a launcher forking such workers must import under)."""
    apply(environ, environ.get(ENV_THREADS))
    return present(environ)


def key(threads: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """What tells launchers apart by the thread variables ``threads`` (`present`): a worker
    is forked from the launcher whose imports were set up under the same ones."""
    return tuple(sorted(threads.items()))


def present(environ: Mapping[str, str]) -> dict[str, str]:
    """The `VARIABLES` set in ``environ``."""
    return {name: environ[name] for name in VARIABLES if name in environ}
