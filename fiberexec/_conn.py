"""One worker's connection as its shard sees it: handshake state, credit and tasks held."""

from __future__ import annotations

import enum
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from fiberexec._argcache import Mirror
from fiberexec._backend import WorkerHandle, WorkerStatus
from fiberexec._task import WorkItem

if TYPE_CHECKING:
    from fiberexec._claims import ClaimBoard
    from fiberexec._events import Link
    from fiberexec._future import Answer

MAX_WINDOW = 1024  # tasks one worker may hold
WINDOW_TIME = 0.002  # seconds of known short work a worker may hold: covers a round trip
LONG_TASK = 0.01  # nothing is queued behind a task this long (or of unknown length)
MAX_RTT = 0.05  # a round trip slower than this says more about the peer than the link


class State(enum.Enum):
    AWAIT_HELLO = "connecting"
    READY = "ready"
    RETIRING = "retiring"  # told to leave, or leaving by itself (max_tasks_per_child)
    DISCONNECTED = "disconnected"  # connection lost, waiting for the backend's exit status
    GONE = "gone"


class Conn:
    def __init__(self, worker_id: str, channel: Link, max_tasks: int, *, now: float) -> None:
        self.worker_id = worker_id
        self.order = (len(worker_id), worker_id)  # how `workers()` lists it: w2 before w10
        self.channel = channel
        self.max_tasks = max_tasks  # 0: unlimited
        self.state = State.AWAIT_HELLO
        self.handle: WorkerHandle | None = None
        self.status: WorkerStatus | None = None
        self.fault = ""  # the interpreter's report of the fault that ended it, if one came
        self.pipe: Any = None  # the nng pipe of the peer that is (being) authenticated
        self.nonce = b""  # ours for its handshake (in its start request): one use
        self.doomed: list[WorkItem] = []  # out of retries; failed once the exit status is known
        self.charged: WorkItem | None = None  # the task it was running when it was lost
        self.why: str | None = None  # how the connection was lost, when we know better
        self.leaving: str | None = None  # why an orderly exit was agreed ("idle", ...)
        self.counted = False  # included in the shard's ready_workers
        self.claims: ClaimBoard | None = None  # a board to take tasks back without asking
        self.numbered = 0  # tasks sent so far: the next one's number on the board
        self.shm = False
        self.initializing = False  # sent an initializer it has not reported finishing
        self.inflight: dict[int, WorkItem] = {}  # dispatch order == run order
        self.dispatched = 0  # tasks sent it, less those it gave back unstarted
        self.load = 0.0  # estimated seconds of work held, over tasks of known length
        self.unknown = 0  # tasks held whose length is not known yet
        self.window = WINDOW_TIME  # seconds of short work to hold: WINDOW_TIME + 2 round trips
        self.rtt = float("inf")  # the shortest round trip seen (see measured_rtt)
        self.timed: tuple[int, float] | None = None  # a task sent it idle, and when: a round trip
        self.setup_sent = 0.0  # when the handshake's answer went, until it is answered
        self.created = now  # on the shard's clock
        self.last_recv = self.last_sent = self.idle_since = self.created
        # its CPU time when a look while it was silent found it changed, and when
        self.silent_cpu: tuple[float, float] | None = None
        self.deadline = 0.0  # when DISCONNECTED: stop waiting for the exit status
        self.head_since = now  # when the first task it holds started (about: sent or freed)
        self.overstaying = False  # its first task outran its estimate: queue nothing behind
        self.revoking = False  # asked to give back tasks it has not started
        # each Revoke not answered yet: the cancels waiting on it, and whether it was ours
        self.revokes: deque[tuple[dict[int, Answer], bool]] = deque()
        self.cache: Mirror | None = None  # what it keeps of large arguments
        # What workers() shows (`fiberexec._observe`); written only by the shard's thread.
        self.host = ""  # as the worker said in its Hello
        self.pid = 0
        self.tasks_done = self.tasks_failed = 0
        self.cpu_percent = -1.0  # from its last heartbeat; negative: not reported yet
        self.rss_bytes = 0  # 0: not reported yet
        self.lost = False  # died, was cut off, or never connected (else it left in order)
        self.ended: float | None = None  # when it left the shard's table (shard's clock)
        self.stack_requests: dict[int, Future[str]] = {}  # dump_stack calls awaiting it
        self.collected = False  # a thread waiting for its answer reads it (Shard.collect)

    @property
    def pipe_id(self) -> int | None:
        return None if self.pipe is None else int(self.pipe.id)

    def admits(self, estimate: float | None, allowance: int = MAX_WINDOW) -> bool:
        """Whether to send this worker a task estimated to take ``estimate`` seconds.

        Prefetch is measured in time, not tasks. A task of unknown length is sent only to a
        worker that holds nothing (as a free process takes the next task from the standard
        library's call queue); behind a known short task (under `LONG_TASK`) a worker holds
        one more, or as many known short tasks as fit in its window (`WINDOW_TIME` plus two
        round trips); behind a long one, nothing. So no task waits behind a slow one while
        another worker could run it, and a future is marked running shortly before it runs.

        Estimates are per function, and arguments change durations: so the number of tasks
        sent ahead behind the running one is at most ``allowance``, which the shard starts
        small and doubles with each batch of results that came back as estimated (slow
        start), and sets back to one when a task outran its estimate.
        """
        if self.state is not State.READY:
            return False
        if self.max_tasks and self.dispatched >= self.max_tasks:
            return False
        held = len(self.inflight)
        if held == 0:
            return True
        if estimate is None or self.unknown or self.overstaying:
            return False
        if held > allowance:
            return False
        if held == 1:
            return self.load < LONG_TASK and estimate < LONG_TASK
        return held < MAX_WINDOW and estimate < LONG_TASK and self.load + estimate <= self.window

    def holds_alone(self) -> bool:
        """Whether `admits` refuses every task until a result comes back: it holds one
        task, of unknown length or a long one (the worker need not watch for more)."""
        return len(self.inflight) == 1 and (self.unknown > 0 or self.load >= LONG_TASK)

    def measured_rtt(self, seconds: float) -> None:
        """A round trip seen (from the handshake's answer to the worker's first heartbeat,
        then each task sent to it idle, less its run time): a far worker holds more, so it
        never waits for work. The shortest counts: a first heartbeat sent while the machine
        was busy starting workers says little of the link, and a window too wide lets one
        worker take most of a map while another idles; in whichever order the two kinds come
        (a task sent before the first heartbeat arrived kept the window at its start)."""
        self.rtt = min(self.rtt, max(seconds, 0.0))
        self.window = WINDOW_TIME + 2 * min(self.rtt, MAX_RTT)

    def hold(self, item: WorkItem, estimate: float | None) -> None:
        """Count ``item`` as sent here: held until its result arrives, its cost (to give
        back then) and its number on the claim board (the worker numbers what it receives
        the same way)."""
        self.inflight[item.task_id] = item
        self.dispatched += 1  # counted now: `admits` sees the tasks of a batch being built
        item.number = self.numbered
        self.numbered += 1
        if estimate is None:
            self.unknown += 1
            item.cost = -1.0
        else:
            self.load += estimate
            item.cost = estimate

    def give_back(self, cost: float) -> None:
        """A task it held went back unstarted: it never counts towards max_tasks_per_child
        (the worker counts what it ran, and leaves at its limit)."""
        self.dispatched -= 1
        self.release(cost)

    def release(self, cost: float) -> None:
        if cost < 0:
            self.unknown -= 1
        else:
            self.load -= cost

    def describe_exit(self) -> str:
        if self.status is not None:
            return f"worker {self.worker_id} {self.status.describe()}"
        return f"worker {self.worker_id} lost its connection"
