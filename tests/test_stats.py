"""`Stats`: a frozen snapshot whose repr a person can read."""

from __future__ import annotations

import dataclasses

import pytest

from fiberexec import Stats

COUNTS = dict(workers=2, workers_starting=0, tasks_pending=1, tasks_running=2, tasks_done=30,
              tasks_failed=1, tasks_retried=0, tasks_stolen=3, workers_lost=0,
              messages_rejected=0)


def test_repr_rounds_the_throughput_and_keeps_every_field() -> None:
    stats = Stats(**COUNTS, throughput=14460.627468660341)
    assert repr(stats) == (
        "Stats(workers=2, workers_starting=0, tasks_pending=1, tasks_running=2, tasks_done=30, "
        "tasks_failed=1, tasks_retried=0, tasks_stolen=3, workers_lost=0, messages_rejected=0, "
        "throughput=14460.6, args_kept_bytes=0, args_saved_bytes=0, bytes_sent=0, "
        "bytes_received=0, tasks_submitted=0)")
    assert stats.throughput == 14460.627468660341  # the value itself is not rounded


@pytest.mark.parametrize(("rate", "shown"), [(0.0, "0.0"), (3.14159, "3.14"),
                                             (0.041234, "0.0412"), (99.96, "100.0")])
def test_slow_rates_keep_three_significant_digits(rate: float, shown: str) -> None:
    assert repr(Stats(**COUNTS, throughput=rate)).endswith(
        f"throughput={shown}, args_kept_bytes=0, args_saved_bytes=0, bytes_sent=0, "
        "bytes_received=0, tasks_submitted=0)")


def test_still_a_frozen_dataclass_with_the_same_fields() -> None:
    stats = Stats(**COUNTS, throughput=1.0)
    assert [f.name for f in dataclasses.fields(Stats)] == [
        *COUNTS, "throughput", "args_kept_bytes", "args_saved_bytes", "bytes_sent",
        "bytes_received", "tasks_submitted"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.workers = 3  # type: ignore[misc]
    assert stats == Stats(**COUNTS, throughput=1.0)
