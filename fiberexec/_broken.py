"""The errors that are also the standard library's `BrokenProcessPool` (see `fiberexec._errors`,
which hands them out on first use)."""

from __future__ import annotations

import pickle
from concurrent.futures.process import BrokenProcessPool

from fiberexec._errors import FiberExecError, SerializationError


class UnpicklingError(SerializationError, pickle.UnpicklingError, BrokenProcessPool):
    """A task could not be unpickled in its worker, or its result in the executor."""


class WorkerLostError(FiberExecError, BrokenProcessPool):
    """A task was running on workers that died, ``max_task_retries`` times over."""


class BrokenFiberExecutor(BrokenProcessPool):
    """The executor can no longer run tasks (a worker could not start, an initializer failed)."""
