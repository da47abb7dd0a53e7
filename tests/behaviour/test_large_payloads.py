"""Arguments and results made of many Python objects (a long pickle stream, no buffers of
their own) arrive whole, both ways, on every backend: through shared memory where the
worker shares it, inline where it does not; as with the stdlib."""

from __future__ import annotations

from tests import tasks
from tests.behaviour.both import Make, make

__all__ = ["make"]


def test_a_long_list_of_objects_goes_to_a_task_and_comes_back_whole(make: Make) -> None:
    rows = [(i, f"row {i:08d}", float(i) / 3) for i in range(150_000)]  # a 4.5 MiB stream
    ex = make(1)
    back = ex.submit(tasks.identity, rows).result(timeout=120)
    assert back == rows
    assert [len(r) for r in ex.map(tasks.identity, [rows[:70_000], rows], timeout=120)] == [
        70_000, 150_000]
