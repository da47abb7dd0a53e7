"""Retry as data: a small value that builds a tenacity policy for backend calls.

Only `TransientBackendError` is retried; a permanent error or any other exception goes straight
through. A ``retry_after`` the remote side asked for (HTTP 429) is honoured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from fiberexec._errors import ConfigurationError, TransientBackendError

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

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"retry attempts must be >= 1, got {self.attempts}")
        if self.deadline <= 0:
            raise ConfigurationError(f"retry deadline must be > 0 seconds, got {self.deadline}")

    def call(
        self,
        fn: Callable[[], T],
        *,
        sleep: Callable[[float], None] = time.sleep,
        before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    ) -> T:
        """Call ``fn`` until it succeeds, raises a non-transient error, or the policy runs out.

        When it runs out, the last `TransientBackendError` is raised as it was.
        """
        retrying = tenacity.Retrying(
            stop=(
                tenacity.stop_after_attempt(self.attempts)
                | tenacity.stop_after_delay(self.deadline)
            ),
            wait=_RetryAfterOr(
                tenacity.wait_exponential(multiplier=self.initial, max=self.maximum)
                + tenacity.wait_random(0, self.jitter)
            ),
            retry=tenacity.retry_if_exception_type(TransientBackendError),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(fn)


class _RetryAfterOr(tenacity.wait.wait_base):
    """Wait what the server asked (``retry_after``) when it is longer than the backoff."""

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
