"""One worker's connection as its shard sees it: handshake state, credit and tasks held."""

from __future__ import annotations

import enum
import math
import time
from typing import Any

from fiberexec._backend import WorkerHandle, WorkerStatus
from fiberexec._channel import Channel
from fiberexec._task import WorkItem

INITIAL_WINDOW = 8
MIN_WINDOW = 2
MAX_WINDOW = 1024
WINDOW_TIME = 0.002  # keep about this much work queued at each worker
LONG_TASK = 0.05  # tasks this long are sent one at a time: prefetch would only delay others


class State(enum.Enum):
    AWAIT_HELLO = "connecting"
    AWAIT_AUTH = "authenticating"
    READY = "ready"
    RETIRING = "retiring"  # told to leave, or leaving by itself (max_tasks_per_child)
    DISCONNECTED = "disconnected"  # connection lost, waiting for the backend's exit status
    GONE = "gone"


class Conn:
    def __init__(self, worker_id: str, channel: Channel, max_tasks: int) -> None:
        self.worker_id = worker_id
        self.channel = channel
        self.max_tasks = max_tasks  # 0: unlimited
        self.state = State.AWAIT_HELLO
        self.handle: WorkerHandle | None = None
        self.status: WorkerStatus | None = None
        self.pipe: Any = None  # the nng pipe of the peer that is (being) authenticated
        self.nonce = b""
        self.worker_nonce = b""
        self.doomed: list[WorkItem] = []  # out of retries; failed once the exit status is known
        self.why: str | None = None  # how the connection was lost, when we know better
        self.leaving: str | None = None  # why an orderly exit was agreed ("idle", ...)
        self.counted = False  # included in the shard's ready_workers
        self.probe = ""  # this handshake's shared-memory probe file, removed when it ends
        self.shm = False
        self.inflight: dict[int, WorkItem] = {}  # dispatch order == run order
        self.dispatched = 0
        self.ewma: float | None = None
        self.created = time.monotonic()
        self.last_recv = self.last_sent = self.idle_since = self.created
        self.deadline = 0.0  # when DISCONNECTED: stop waiting for the exit status

    @property
    def pipe_id(self) -> int | None:
        return None if self.pipe is None else int(self.pipe.id)

    def credit(self) -> int:
        """How many more tasks this worker should hold right now."""
        if self.state is not State.READY:
            return 0
        if self.ewma is None:
            window = INITIAL_WINDOW
        elif self.ewma >= LONG_TASK:
            window = 1
        else:
            window = min(MAX_WINDOW, max(MIN_WINDOW, math.ceil(WINDOW_TIME / max(self.ewma, 1e-7))))
        credit = window - len(self.inflight)
        if self.max_tasks:
            credit = min(credit, self.max_tasks - self.dispatched)
        return max(0, credit)

    def observe(self, runtime: float) -> None:
        self.ewma = runtime if self.ewma is None else 0.8 * self.ewma + 0.2 * runtime

    def describe_exit(self) -> str:
        if self.status is not None:
            return f"worker {self.worker_id} {self.status.describe()}"
        return f"worker {self.worker_id} lost its connection"
