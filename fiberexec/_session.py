"""What a shard is built from: the executor's frozen session, and the lifecycle it reports to.

A shard knows nothing of the pool that made it. It gets a `Session` (values fixed before the
first worker starts) and a `Lifecycle` (what it tells the rest of the executor about its
workers; `fiberexec._supervisor.WorkerSupervisor` in production, a recorder in unit tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fiberexec._backend import WorkerHandle, WorkerStatus
from fiberexec._config import ExecutorConfig
from fiberexec._protocol import OutputMode
from fiberexec._serialize import Payload


@dataclass(frozen=True)
class Session:
    config: ExecutorConfig
    executor_id: str
    secret: bytes  # workers prove they hold it before anything they send is unpickled
    initializer: Payload | None = None  # pickled (initializer, initargs)
    shm: bool = False  # this host has /dev/shm: large buffers may go through it
    output: OutputMode = OutputMode.INHERIT  # what workers do with their tasks' output


class Lifecycle(Protocol):
    """What a shard reports about its workers, from its own thread (calls must not block)."""

    def worker_ready(self, worker_id: str) -> None:
        """The worker authenticated and may be given tasks."""

    def worker_gone(self, worker_id: str, handle: WorkerHandle | None, *, replace: bool,
                    lost: bool = False, waiting: Callable[[], bool] | None = None) -> None:
        """The worker left (or was ``lost``: died, cut off); start another one if
        ``replace`` and work remains (replacements of lost workers are paced). One that
        retired is replaced only while ``waiting()`` says tasks wait in its shard's queue
        (asked under the lock a submit asks whether to start workers under: a task that came
        while it retired is seen here, or starts a worker itself)."""

    def worker_failed_to_start(self, worker_id: str, status: WorkerStatus | None) -> None:
        """The worker ended, or timed out, before it authenticated."""

    def may_retire(self, worker_id: str) -> bool:
        """Whether an idle worker may leave (the answer reserves its leaving)."""

    def ready_count(self) -> int:
        """Workers ready across the whole executor."""

    def starting(self, index: int) -> int:
        """Workers being started for shard ``index`` (or not yet given a shard)."""

    def break_executor(self, message: str, cause: BaseException | None) -> None:
        """The executor cannot go on; every shard is told with a `Broken` event."""

    def progress(self) -> None:
        """Results arrived: the progress hook may want to hear."""

    def output(self, worker_id: str, host: str, stdout: bytes, stderr: bytes) -> None:
        """Lines a worker's tasks wrote (``output="forward"`` or a directory)."""
