"""Small programs that parallelize a real library with a process pool (`benchmarks.libraries`).

Each module is what a user would write: it imports its library, defines the objective, and
hands the library a pool or an executor. The pool is the only thing that differs between
the two runs, and in a user's script that is one line:

    import multiprocessing as mp
    ->  import fiberexec.multiprocessing as mp

    from concurrent.futures import ProcessPoolExecutor as Executor
    ->  from fiberexec import FiberExecutor as Executor

So every module's ``run`` takes that module (``mp``) or that class (``Executor``) and the
size, builds its pool of `WORKERS` with it, and returns the seconds from just before the
pool's constructor to the library's result (start-up included), the number of objective
evaluations and what the library found. All objectives are `model.misfit` or derived from
it: about 1 ms of numpy per evaluation, so what a pool costs per task shows.
"""

from __future__ import annotations

from typing import Any

WORKERS = 2

Outcome = dict[str, Any]
