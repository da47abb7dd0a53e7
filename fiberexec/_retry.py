"""Retry as data: a small value that builds a tenacity policy for backend calls.

Only `TransientBackendError` is retried; a permanent error or any other exception goes straight
through. A ``retry_after`` the remote side asked for (HTTP 429) is honoured. A call given an
``abandon`` event makes no attempt once it is set, and its backoff sleep ends when it is set
(the executor broke or shut down: nothing more is started).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fiberexec._errors import ConfigurationError, TransientBackendError

if TYPE_CHECKING:  # imported by the first call (5-8 ms, not paid by an import of fiberexec)
    import tenacity

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by attempts and a deadline.

    Example:
        >>> RetryPolicy(attempts=5, deadline=30.0).call(lambda: "done")
        'done'
    """

    attempts: int = 8
    deadline: float = 60.0
    initial: float = 0.1
    maximum: float = 5.0
    jitter: float = 0.2
    #: Starting workers only: once every worker is lost, starts that keep failing for this
    #: many seconds break the executor with their cause (the full ``deadline`` applies while
    #: other workers serve).
    deadline_without_workers: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise ConfigurationError(
                f"retry attempts must be a whole number >= 1, got {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigurationError(f"retry attempts must be >= 1, got {self.attempts}")
        for name, low, strict in (("deadline", 0.0, True), ("deadline_without_workers", 0.0, True),
                                  ("initial", 0.0, False), ("maximum", 0.0, False),
                                  ("jitter", 0.0, False)):
            value = getattr(self, name)
            ok = (isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value) and (value > low if strict else value >= low))
            if not ok:
                raise ConfigurationError(
                    f"retry {name} must be a number of seconds {'>' if strict else '>='} 0, "
                    f"got {value!r}")

    def call(
        self,
        fn: Callable[[], T],
        *,
        sleep: Callable[[float], None] = time.sleep,
        before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
        abandon: threading.Event | None = None,
    ) -> T:
        """Call ``fn`` until it succeeds, raises a non-transient error, or the policy runs out
        (or ``abandon`` is set: no attempt is made after that, and a backoff ends at once).

        When it runs out, the last `TransientBackendError` is raised as it was.
        """
        if abandon is not None:
            sleep = _sleep_unless(abandon)
            fn = _unless_abandoned(fn, abandon)
        started = time.monotonic()
        try:  # most calls succeed at once: tenacity is imported when one does not
            return fn()
        except TransientBackendError as exc:
            first = exc
        return self._retry(fn, first, time.monotonic() - started, sleep, before_sleep, abandon)

    def _retry(  # noqa: PLR0917  # `call`'s state, passed on
        self, fn: Callable[[], T], first: TransientBackendError, spent: float,
        sleep: Callable[[float], None],
        before_sleep: Callable[[tenacity.RetryCallState], None] | None,
        abandon: threading.Event | None,
    ) -> T:
        """`call` after its first attempt failed with ``first``, ``spent`` seconds into the
        deadline: tenacity goes on, its first attempt raising ``first`` again (no call)."""
        import tenacity

        replay = [first]

        def attempt() -> T:
            if replay:
                raise replay.pop()
            return fn()

        stop: Callable[[tenacity.RetryCallState], bool] = tenacity.stop_after_attempt(
            self.attempts) | tenacity.stop_after_delay(max(0.0, self.deadline - spent))
        if abandon is not None:
            stop = _Abandoned(abandon, stop)
        retrying = tenacity.Retrying(
            stop=stop,
            wait=_RetryAfterOr(
                tenacity.wait_exponential(multiplier=self.initial, max=self.maximum)
                + tenacity.wait_random(0, self.jitter)
            ),
            retry=tenacity.retry_if_exception_type(TransientBackendError),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)


class Abandoned(RuntimeError):
    """A call whose ``abandon`` event was set before its first attempt: ``fn`` never ran."""


class _Abandoned:
    """Stop retrying once ``event`` is set, or when ``otherwise`` says so (a tenacity stop
    condition)."""

    def __init__(self, event: threading.Event,
                 otherwise: Callable[[tenacity.RetryCallState], bool]) -> None:
        self.event, self.otherwise = event, otherwise

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.event.is_set() or self.otherwise(retry_state)


def _unless_abandoned(fn: Callable[[], T], event: threading.Event) -> Callable[[], T]:
    """``fn``, except that once ``event`` is set an attempt raises the last one's error."""
    last: list[BaseException] = []

    def attempt() -> T:
        if event.is_set():  # not even a first attempt once the caller gave up
            raise last[-1] if last else Abandoned(
                "abandoned before its first attempt: the caller stopped (broken or shut down)")
        try:
            return fn()
        except BaseException as exc:
            last[:] = [exc]
            raise
    return attempt


def _sleep_unless(event: threading.Event) -> Callable[[float], None]:
    """A backoff sleep that ends when ``event`` is set."""
    def sleep(seconds: float) -> None:
        event.wait(seconds)
    return sleep


class _RetryAfterOr:
    """Wait what the server asked (``retry_after``) when it is longer than the backoff (a
    tenacity wait strategy)."""

    def __init__(self, backoff: tenacity.wait.wait_base) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        wait = float(self.backoff(retry_state))
        outcome = retry_state.outcome
        if outcome is not None and outcome.failed:
            exc = outcome.exception()
            if isinstance(exc, TransientBackendError) and exc.retry_after is not None:
                wait = max(wait, exc.retry_after)
        return wait
