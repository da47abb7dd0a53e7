"""`RetryPolicy.call`: what is retried, how often, how long it waits, and when it stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fiberexec import RetryPolicy
from fiberexec._errors import PermanentBackendError, TransientBackendError
from fiberexec._retry import Abandoned


class Flaky:
    """Raises the errors given, one a call, then returns ``"done"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def _call(policy: RetryPolicy, fn: Callable[[], Any], **kwargs: Any) -> tuple[Any, list[float]]:
    waits: list[float] = []
    return policy.call(fn, sleep=waits.append, **kwargs), waits


def test_a_call_that_succeeds_at_once_is_made_once_and_never_waits() -> None:
    fn = Flaky()
    assert _call(RetryPolicy(), fn) == ("done", [])
    assert fn.calls == 1


def test_transient_failures_are_retried_with_a_growing_backoff() -> None:
    fn = Flaky(*(TransientBackendError(f"busy {i}") for i in range(3)))
    policy = RetryPolicy(attempts=5, initial=0.1, maximum=5.0, jitter=0.0)
    seen: list[int] = []
    result, waits = _call(policy, fn,
                          before_sleep=lambda state: seen.append(state.attempt_number))
    assert result == "done" and fn.calls == 4
    assert seen == [1, 2, 3]  # the hook hears each failed attempt, the first one too
    assert len(waits) == 3 and waits == sorted(waits) and waits[0] > 0


def test_the_last_transient_error_is_raised_as_it_was_once_attempts_run_out() -> None:
    errors = [TransientBackendError(f"busy {i}") for i in range(3)]
    fn = Flaky(*errors)
    with pytest.raises(TransientBackendError) as caught:
        _call(RetryPolicy(attempts=3, jitter=0.0), fn)
    assert caught.value is errors[-1] and fn.calls == 3


def test_one_attempt_means_no_retry() -> None:
    error = TransientBackendError("busy")
    fn = Flaky(error)
    with pytest.raises(TransientBackendError) as caught:
        _call(RetryPolicy(attempts=1), fn)
    assert caught.value is error and fn.calls == 1


@pytest.mark.parametrize("error", [PermanentBackendError("no such image"), ValueError("bug")])
def test_any_other_error_goes_straight_through(error: Exception) -> None:
    fn = Flaky(error, TransientBackendError("never reached"))
    with pytest.raises(type(error)) as caught:
        _call(RetryPolicy(), fn)
    assert caught.value is error and fn.calls == 1


@pytest.mark.parametrize("failures", [1, 2])
def test_a_wait_the_server_asked_for_is_honoured(failures: int) -> None:
    fn = Flaky(*(TransientBackendError("429", retry_after=7.5) for _ in range(failures)))
    result, waits = _call(RetryPolicy(initial=0.1, maximum=1.0), fn)
    assert result == "done" and waits == [7.5] * failures


def test_the_deadline_counts_the_first_attempt() -> None:
    def slow_failure() -> str:
        time.sleep(0.05)
        raise TransientBackendError("slow and busy")

    with pytest.raises(TransientBackendError):
        _call(RetryPolicy(attempts=50, deadline=0.01, initial=0.0, jitter=0.0), slow_failure)


def test_an_abandoned_call_makes_no_attempt_after_the_event() -> None:
    abandon = threading.Event()
    abandon.set()
    fn = Flaky()
    with pytest.raises(Abandoned):
        RetryPolicy().call(fn, abandon=abandon)
    assert fn.calls == 0


def test_abandoning_during_a_backoff_ends_it_and_raises_the_last_error() -> None:
    abandon = threading.Event()
    errors = [TransientBackendError(f"busy {i}") for i in range(5)]
    fn = Flaky(*errors)
    timer = threading.Timer(0.2, abandon.set)
    timer.start()
    try:
        started = time.monotonic()
        with pytest.raises(TransientBackendError) as caught:
            RetryPolicy(attempts=5, initial=30.0, maximum=30.0, jitter=0.0).call(
                fn, abandon=abandon)
        assert time.monotonic() - started < 20  # the 30 s backoff ended with the event
    finally:
        timer.cancel()
    assert caught.value is errors[0] and fn.calls == 1
