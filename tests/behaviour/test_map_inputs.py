"""`map` over the kinds of input users pass, chunked or not: results in order, the inputs
read during the call. Over `ProcessPoolExecutor` and ours."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from tests import tasks
from tests.behaviour.both import Make, make

__all__ = ["make"]


class Items(list[int]):
    """A list subclass that iterates backwards: its own iteration must be honoured."""

    def __iter__(self) -> Iterator[int]:
        return list.__reversed__(self)


INPUTS: dict[str, Callable[[], Iterable[int]]] = {
    "range": lambda: range(0, 95, 3),
    "empty range": lambda: range(0),
    "tuple": lambda: tuple(range(50)),
    "list": lambda: list(range(50)),
    "list subclass": lambda: Items(range(50)),
    "generator": lambda: (i for i in range(50)),
}


@pytest.mark.parametrize("chunksize", [1, 7, 100])
@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_map_takes_every_kind_of_input(make: Make, kind: str, chunksize: int) -> None:
    expected = [tasks.square(i) for i in INPUTS[kind]()]
    with make(2) as ex:
        assert list(ex.map(tasks.square, INPUTS[kind](), chunksize=chunksize,
                           timeout=60)) == expected


@pytest.mark.parametrize("chunksize", [1, 3])
def test_map_reads_a_list_during_the_call(make: Make, chunksize: int) -> None:
    items = list(range(20))
    with make(2) as ex:
        results = ex.map(tasks.square, items, chunksize=chunksize, timeout=60)
        items[:] = [0] * 20  # changed once map returned: its tasks have their items
        assert list(results) == [i * i for i in range(20)]


def test_map_starts_tasks_while_a_slow_input_is_still_read(make: Make, tmp_path: Path) -> None:
    """The first task runs before the input ends: here the input waits for what it does
    (up to 30 s, then says so), as an input can that is fed by its own tasks' results."""
    flag = tmp_path / "flag"

    def items() -> Iterator[str]:
        yield str(flag)
        deadline, pause = time.monotonic() + 30, threading.Event()
        while not flag.exists() and time.monotonic() < deadline:
            pause.wait(0.01)  # (bounded: the deadline)
        yield "saw the flag" if flag.exists() else "the first task never ran"

    with make(2) as ex:
        assert list(ex.map(tasks.touch_path, items(), timeout=60)) == [
            str(flag), "saw the flag"]


@pytest.mark.parametrize("chunksize", [1, 4])
def test_map_submits_through_a_submit_replaced_on_the_executor(make: Make,
                                                                chunksize: int) -> None:
    """The stdlib's `Executor.map` calls ``self.submit`` for each task (each chunk), and
    libraries count on it: tqdm's progress bars wrap ``submit``, as do subclasses that trace
    or throttle submissions."""
    with make(2) as ex:
        seen: list[tuple[object, ...]] = []
        own = ex.submit

        def counting(fn: Callable[..., object], /, *args: object) -> object:
            seen.append(args)
            return own(fn, *args)

        ex.submit = counting  # type: ignore[method-assign,assignment]
        assert list(ex.map(tasks.square, range(10), chunksize=chunksize)) == [
            tasks.square(i) for i in range(10)]
    assert len(seen) == -(-10 // chunksize)
