"""Calls run on threads of their own at once, for tests that shake shared state."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def at_once(target: Callable[..., object], calls: Iterable[tuple[Any, ...]],
            timeout: float) -> None:
    """``target(*args)`` for each of ``calls``, each on its own thread, all started before
    any is joined; then raise the first error one of them raised (an `AssertionError`
    too). A thread still running after ``timeout`` seconds fails the test."""
    errors: list[BaseException] = []

    def run(*args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # (raised on the test's thread below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=args) for args in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), f"still running after {timeout} s"
    if errors:
        raise errors[0]
