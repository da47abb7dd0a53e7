"""Task functions and objects for the stdlib contract tests, importable by every worker.

The pickling oddballs mirror the ones CPython's own executor tests use: objects that fail,
exit or crash while being pickled or unpickled.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from typing import Any, NoReturn

from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend


def sleep_and_print(seconds: float, text: object) -> None:
    time.sleep(seconds)
    sys.stdout.write(f"{text}\n")  # one write: lines of workers sharing stdout stay whole
    sys.stdout.flush()


def mark_then_sleep(path: str, seconds: float) -> None:
    """Leave a file at ``path`` (the call ran), then sleep."""
    with open(path, "w"):
        pass
    time.sleep(seconds)


def write_in_a_thread(path: str, delay: float) -> bool:
    """Leave a thread (not a daemon) that writes ``path`` after ``delay`` seconds."""
    def write() -> None:
        time.sleep(delay)
        with open(path, "w") as f:
            f.write("written")

    threading.Thread(target=write).start()
    return True


def exit_process(code: int) -> NoReturn:
    os._exit(code)


def exit_interpreter() -> NoReturn:
    sys.exit(1)


def raise_runtime_error() -> NoReturn:
    raise RuntimeError(123)  # the line the remote traceback must show


def return_instance(cls: type) -> Any:
    return cls()


def raise_holding(cls: type) -> NoReturn:
    """Raise an exception whose argument is an instance of ``cls`` (a lock cannot pickle)."""
    raise ValueError(cls())


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` deep: too deep for the pickler's recursion."""
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


def set_item(mapping: Any, key: int) -> int:
    mapping[key] = key * key
    return key


def set_event(event: Any) -> bool:
    event.set()
    return True


STATUS = "uninitialized"


def init_status(value: str) -> None:
    global STATUS
    STATUS = value


def get_status() -> str:
    return STATUS


def init_fail() -> NoReturn:
    raise ValueError("error in initializer")


class ErrorAtPickle:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("Error in pickle")


class ExitAtPickle:
    def __reduce__(self) -> Any:
        sys.exit(1)


class InterruptAtPickle:
    """Its pickling raises what is not an ``Exception`` (a ``__reduce__`` that waits on
    something, interrupted)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt("while pickling")


def _raise_unpickling_error() -> NoReturn:
    raise pickle.UnpicklingError("Error in unpickle")


class ErrorAtUnpickle:
    def __reduce__(self) -> Any:
        return _raise_unpickling_error, ()


class ExitAtUnpickle:
    def __reduce__(self) -> Any:
        return sys.exit, (1,)


class Tracked:
    """An object whose collection the test can observe through a weak reference."""

    def method(self) -> None:
        pass


class SilentBackend(LocalBackend):
    """Starts processes that never dial the executor: workers that never connect."""

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        silent = ("python", "-c", "import time; time.sleep(60)")
        return super().start_worker(
            WorkerSpec(spec.worker_id, spec.executor_id, silent, spec.env, spec.secret_env)
        )
