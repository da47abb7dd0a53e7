"""An open file given to a task is refused, as the stdlib refuses it: sent as a copy of what
is left to read, the task's writes would be lost with no error."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tests import tasks
from tests.behaviour.both import Make, make

__all__ = ["make"]


@pytest.mark.parametrize("mode", ["r", "r+", "a+"])
def test_an_open_file_given_to_a_task_is_refused(make: Make, tmp_path: Path, mode: str) -> None:
    path = tmp_path / "data.txt"
    path.write_text("line\n")
    ex = make(1)
    with path.open(mode) as f:
        future = ex.submit(tasks.identity, f)
        with pytest.raises((TypeError, pickle.PicklingError),
                           match="cannot pickle '_io.TextIOWrapper' object"):
            future.result(timeout=60)
    assert ex.submit(tasks.identity, 7).result(timeout=60) == 7  # the pool goes on
    assert path.read_text() == "line\n"
