"""What other threads tell a shard, as typed events (handled on the shard's thread by `match`).

Who posts what::

    WorkerSupervisor (launcher threads)   Adopt, Started, StartFailed, Broken
    a link whose peer hung up             PipeDown
    the backend's exit watch              Exited
    TaskPool (the user's threads)         Shutdown, Exiting
    another shard                         Steal (asking), Stolen (the answer)
    anyone (tests, diagnostics)           Call: run a function on the shard's thread
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from fiberexec._backend import WorkerHandle, WorkerStatus
from fiberexec._record import record
from fiberexec._task import WorkItem

if TYPE_CHECKING:
    from fiberexec._shard import Shard


class Link(Protocol):
    """The shard's view of one worker's link (`fiberexec._link.Endpoint` in production)."""

    closed: bool

    def fileno(self) -> int: ...

    def try_recv(self) -> Any:
        """The next message (``.bytes`` and ``.pipe``, whose ``.id`` names the peer) or None."""

    def bind(self, pipe: Any) -> None:
        """Send to ``pipe`` from now on."""

    def seal(self) -> None:
        """The bound peer authenticated: no other peer may connect."""

    def send_nowait(self, frame: bytes) -> None:
        """Queue a frame; raise `ProtocolError` when the peer has stopped reading."""

    def take_in(self) -> None:
        """The next `try_recv` reads whatever waits, whatever a selector said."""

    @property
    def peer_gone(self) -> bool:
        """The peer sends went to has hung up."""

    def peer_cpu(self) -> float | None:
        """CPU seconds the peer process has used, where the link can tell; else None."""

    def close(self) -> None: ...


@record
class Adopt:
    """A worker is being started; its channel listens and is the shard's to serve. Its
    start request carries ``nonce``, ours for its handshake (one use)."""

    worker_id: str
    channel: Link
    nonce: bytes


@record
class Started:
    worker_id: str
    handle: WorkerHandle


@record
class StartFailed:
    """The backend could not start the worker (after retries): forget its channel."""

    worker_id: str


@record
class PipeDown:
    """A peer of the worker's channel hung up (maybe an unauthenticated one)."""

    worker_id: str
    pipe_id: int


@record
class Exited:
    """The backend saw the worker end; ``fault`` is the interpreter's own report of a fault
    that ended it (`faulthandler`), from the backend's log, where one was kept."""

    worker_id: str
    status: WorkerStatus
    fault: str = ""


@record
class Shutdown:
    cancel_futures: bool


@record
class Exiting:
    """The interpreter is exiting: wait only briefly for workers that never connected."""


@record
class Broken:
    """The executor is broken: fail what is queued and everything that still arrives."""

    error: BaseException


@record
class Call:
    """Run ``fn`` on the shard's thread, where shard state may be read consistently."""

    fn: Callable[[], None]


@record
class Steal:
    """``thief`` has idle workers: hand it part of the queue (maybe nothing)."""

    thief: Shard


@record
class Stolen:
    items: list[WorkItem]


Event = (
    Adopt | Started | StartFailed | PipeDown | Exited | Shutdown | Exiting | Broken | Call
    | Steal | Stolen
)
