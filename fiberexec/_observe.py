"""The executor's observation records (placeholder: the executor's own module replaces it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskInfo:
    task_id: int
    function: str
    arguments: str
    started: float


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    backend: str
    reference: str
    host: str
    state: str
    task: TaskInfo | None
    tasks_done: int
    tasks_failed: int
    cpu_percent: float | None
    rss_bytes: int | None
    last_heard: float | None


@dataclass(frozen=True)
class TaskSpan:
    task_id: int
    worker_id: str
    function: str
    started: float
    ended: float
    ok: bool


@dataclass(frozen=True)
class FailureInfo:
    task_id: int
    worker_id: str | None
    function: str
    arguments: str
    error: str
    traceback: str
    when: float
