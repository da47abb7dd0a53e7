"""What a lost worker's task is told, in the log and in its error: each loss's cause (exit
code, signal, OOM) as the backend reported it, how often the task was tried, and a hint that
fits the first cause.

    Shard._finalize (exit status known, or waited for) -> Loss on the task it was running
        -> loss_line() for the log: "worker w1 was killed by signal 11 (SIGSEGV) while
           running f(1); retrying it on another worker (try 2 of 3, max_task_retries=2)"
        -> out of retries: lost_message() for its WorkerLostError
"""

from __future__ import annotations

from dataclasses import dataclass

from fiberexec._backend import WorkerStatus
from fiberexec._task import WorkItem, describe


@dataclass(frozen=True, slots=True)
class Loss:
    """One worker lost while a task ran on it: which, how it ended (a phrase), its status."""

    worker_id: str
    phrase: str  # "was killed by signal 11 (SIGSEGV)", "lost its connection", ...
    status: WorkerStatus | None


def phrase_of(why: str, worker_id: str) -> str:
    """``why`` without its leading ``worker <id>``: what happened to the worker."""
    return why.removeprefix(f"worker {worker_id} ")


def loss_line(why: str, item: WorkItem | None, retries: int, *, failed: bool) -> str:
    """The log line of a loss: how the worker ended, and what became of its task."""
    if item is None:
        return why
    task = describe(item)
    if failed:
        return (f"{why} while running {task}; it was tried {item.losses} times "
                f"(max_task_retries={retries}) and fails")
    return (f"{why} while running {task}; retrying it on another worker "
            f"(try {item.losses + 1} of {retries + 1}, max_task_retries={retries})")


def lost_message(item: WorkItem, retries: int) -> str:
    """The message of the `WorkerLostError` of a task out of retries."""
    losses = item.causes
    workers = "1 worker that" if item.losses == 1 else f"{item.losses} workers that"
    return (f"{describe(item)} was running on {workers} died: "
            f"{_causes(losses)}. {hint(losses, retries)}")


def _causes(losses: tuple[Loss, ...]) -> str:
    if not losses:
        return "how they ended is not known"
    if len({loss.phrase for loss in losses}) == 1:
        who = ", ".join(loss.worker_id for loss in losses)
        return f"{'each' if len(losses) > 1 else 'it'} {losses[0].phrase} ({who})"
    return "; ".join(f"worker {loss.worker_id} {loss.phrase}" for loss in losses)


# signals a process gets for its own fault: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT
_FAULTS = frozenset({11, 7, 8, 4, 6})
FAULT_LINES = 60  # of a worker's log, read for its fault report


def faulted(status: WorkerStatus) -> bool:
    """Whether a fault in native code ended the worker: its own signal, or a container's or
    shell's 128 + that signal."""
    code = status.exit_code
    return code is not None and (-code in _FAULTS or (code > 128 and code - 128 in _FAULTS))


def fault_report(log: str) -> str:
    """The last report `faulthandler` wrote in a worker's log (from its "Fatal Python
    error" line on), or "" if there is none."""
    start = log.rfind("Fatal Python error")
    return log[start:].strip() if start >= 0 else ""


def hint(losses: tuple[Loss, ...], retries: int) -> str:
    """What to do about a task that kept losing its workers, from how the first one ended
    (the first cause is the task's own; later ones may be a consequence)."""
    first = next((loss.status for loss in losses if loss.status is not None), None)
    code = first.exit_code if first is not None else None
    reason = (first.reason or "") if first is not None else ""
    if code in {-9, 137} or "OOM" in reason or "memory" in reason.lower():
        cause = ("check the task's memory use (the kernel's out-of-memory killer sends "
                 "SIGKILL; or raise memory=), or what else kills the workers")
    elif first is not None and faulted(first):
        cause = "the task crashes its process (a fault in native code)"
    elif code is not None and code < 0:
        cause = ("the workers were signalled: by something outside them (a kill, the "
                 "system or a scheduler stopping them), or by the task itself")
    elif code is not None:
        cause = "the task ends its process (os._exit, or exit() in native code?)"
    else:
        cause = "check the worker's output, and the task's memory use"
    tried = (f"It was tried {retries + 1} times (max_task_retries={retries})" if retries
             else "It was tried once (max_task_retries=0)")
    return f"{tried}; if the loss is transient, raise max_task_retries; otherwise {cause}"
