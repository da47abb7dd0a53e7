"""A function pickled by value is sent as the bytes kept from before only while nothing it
reads can have changed (`fiberexec._byvalue`): a worker always runs what the function would
compute here at the moment it is sent.

Each function is defined inside its test, so that it is pickled by value, as a function
from a script's ``__main__`` is."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiberexec import _byvalue
from fiberexec._serialize import dumps_function, loads

SCALE = 3
WEIGHTS = [1.0, 2.0]
MODULE = sys.modules[__name__]


def sent(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a worker gets it."""
    return loads(dumps_function(fn))  # type: ignore[no-any-return]


def twice(fn: Callable[..., Any]) -> bytes:
    """Send ``fn`` twice, as two batches of tasks would: from then on it may be kept."""
    dumps_function(fn)
    return dumps_function(fn).data


@pytest.fixture(autouse=True)
def _forget() -> None:
    _byvalue._recipes.clear()


def test_the_bytes_are_kept_while_nothing_read_changes() -> None:
    def scaled(x: float) -> float:
        return math.floor(x) * SCALE

    kept = twice(scaled)
    assert dumps_function(scaled).data is kept
    assert sent(scaled)(2.5) == 6


def test_a_global_bound_again_is_sent_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    def scaled(x: float) -> float:
        return x * SCALE

    kept = twice(scaled)
    monkeypatch.setattr(MODULE, "SCALE", 10)
    assert dumps_function(scaled).data is not kept
    assert sent(scaled)(2) == 20
    assert dumps_function(scaled).data is dumps_function(scaled).data  # kept again


def test_a_mutable_global_is_pickled_every_time() -> None:
    def total() -> float:
        return sum(WEIGHTS)

    twice(total)
    WEIGHTS.append(4.0)
    try:
        assert sent(total)() == 7.0
        assert dumps_function(total).data is not dumps_function(total).data
    finally:
        WEIGHTS.pop()


TABLE = bytearray(2 << 20)  # 2 MiB that can change in place


def test_a_function_sent_again_and_again_with_large_globals_is_said_once() -> None:
    """Pickled by value, a function travels with what it reads; a global that can change in
    place is pickled again for every batch of tasks. At a MiB or more that is said (once, as
    a `PerformanceWarning` at the function's definition), naming the global and what to
    do."""
    from fiberexec import PerformanceWarning

    def lookup(i: int) -> int:
        return TABLE[i] + len(WEIGHTS)

    with pytest.warns(PerformanceWarning) as said:
        results = [sent(lookup)(0) for _ in range(4)]
    assert results == [2] * 4 and len(said) == 1
    text = str(said[0].message)
    assert text.startswith("test_a_function_sent_again_and_again_with_large_globals_is_said_"
                           "once.<locals>.lookup() is sent by value")
    assert "TABLE (bytearray of 2.0 MiB)" in text and "initializer" in text
    assert "WEIGHTS (list of 2 items)" in text
    assert (said[0].filename, said[0].lineno) == (__file__, lookup.__code__.co_firstlineno)


def test_a_closure_cell_bound_again_is_sent_anew() -> None:
    factor = 2

    def scaled(x: int) -> int:
        return x * factor

    twice(scaled)
    factor = 5  # read through the closure
    assert sent(scaled)(2) == 10


def test_defaults_and_attributes_changed_are_sent_anew() -> None:
    def shifted(x: int, by: int = 1, *, double: bool = False) -> int:
        return (x + by) * (2 if double else 1) + getattr(shifted, "extra", 0)

    twice(shifted)
    shifted.__defaults__ = (5,)
    assert sent(shifted)(1) == 6
    shifted.__kwdefaults__ = {"double": True}
    assert sent(shifted)(1) == 12
    shifted.extra = 100  # type: ignore[attr-defined]
    assert sent(shifted)(1) == 112


def test_a_helper_defined_again_is_sent_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    def helper(x: int) -> int:
        return x + 1

    monkeypatch.setattr(MODULE, "HELPER", helper, raising=False)

    def uses() -> int:
        return HELPER(1)  # type: ignore[name-defined,no-any-return]  # noqa: F821

    twice(uses)
    assert dumps_function(uses).data is dumps_function(uses).data
    monkeypatch.setattr(MODULE, "HELPER", lambda x: x * 100)
    assert sent(uses)() == 100


def test_a_module_imported_since_makes_it_pickled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def scaled(x: int) -> int:
        return x * SCALE

    kept = twice(scaled)
    monkeypatch.setitem(sys.modules, "fiberexec_test_new_module", types.ModuleType("new"))
    assert dumps_function(scaled).data is not kept


def test_a_function_seen_once_costs_no_recipe() -> None:
    dumps_function(lambda: SCALE)
    assert all(recipe is None for recipe in _byvalue._recipes.values())


# ------------------------------------------------------------------------ the property

Change = tuple[str, int]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["global", "list", "cell", "default", "send"]),
                          st.integers(-5, 5)), max_size=25))
def test_what_is_sent_always_computes_what_the_function_would_here(
        changes: list[Change]) -> None:
    """Whatever is changed between sends, in whatever order, the function a worker gets
    computes what the function computes here at that moment."""
    global SCALE
    _byvalue._recipes.clear()
    old_scale, old_weights = SCALE, list(WEIGHTS)
    offset = 0

    def model(x: int, bump: int = 0) -> float:
        return x * SCALE + sum(WEIGHTS) + offset + bump

    try:
        for kind, value in changes:
            if kind == "global":
                SCALE = value
            elif kind == "list":
                WEIGHTS.append(float(value))
            elif kind == "cell":
                offset = value
            elif kind == "default":
                model.__defaults__ = (value,)
            assert sent(model)(2) == model(2)
    finally:
        SCALE = old_scale
        WEIGHTS[:] = old_weights


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["global", "cell", "default", "tuple"]),
                          st.integers(-5, 5)), max_size=25))
def test_kept_bytes_always_compute_what_the_function_would_here(
        changes: list[Change]) -> None:
    """The same with only immutable values read, where the bytes are kept between changes."""
    global SCALE
    _byvalue._recipes.clear()
    old_scale = SCALE
    offset = 0
    pair = (1, 2)

    def model(x: int, bump: int = 0) -> float:
        return x * SCALE + offset + bump + pair[0]

    try:
        for kind, value in changes:
            if kind == "global":
                SCALE = value
            elif kind == "cell":
                offset = value
            elif kind == "default":
                model.__defaults__ = (value,)
            elif kind == "tuple":
                pair = (value, value)
            assert sent(model)(2) == model(2)
    finally:
        SCALE = old_scale


def test_a_function_among_arguments_travels_as_its_kept_bytes_and_is_made_once() -> None:
    """A chunk of a map carries the map's function as an argument: it is not pickled and
    unpickled again for every chunk (`fiberexec._functions`)."""
    from fiberexec._serialize import dumps

    def scaled(x: int) -> int:
        return x * SCALE

    sent = [dumps(((scaled, n), {}), what="arguments", functions_as_bytes=True)
            for n in (1, 2, 3)]
    made = [loads(payload)[0] for payload in sent]
    assert made[0][0] is made[1][0] is made[2][0]  # one function, made once here
    assert [fn(n) for fn, n in made] == [3, 6, 9]


def test_a_function_among_arguments_is_sent_anew_when_what_it_reads_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fiberexec._serialize import dumps

    def scaled(x: int) -> int:
        return x * SCALE

    def run(n: int) -> int:
        fn, arg = loads(dumps(((scaled, n), {}), what="arguments", functions_as_bytes=True))[0]
        return int(fn(arg))

    assert [run(2), run(2)] == [6, 6]
    monkeypatch.setattr(MODULE, "SCALE", 5)
    assert run(2) == 10


def test_a_map_of_a_local_function_in_chunks_sees_its_globals_as_they_are() -> None:
    from fiberexec import FiberExecutor

    def scaled(x: int) -> int:
        return x * SCALE

    with FiberExecutor(2) as ex:
        assert list(ex.map(scaled, range(40), chunksize=3)) == [3 * x for x in range(40)]
        MODULE.SCALE = 7
        try:
            assert list(ex.map(scaled, range(40), chunksize=3)) == [7 * x for x in range(40)]
        finally:
            MODULE.SCALE = 3


class _Reduced:
    """Counts how often it is pickled (a script's class, as `script_objects` looks)."""

    reduced = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        type(self).reduced += 1
        return (_Reduced, (self.value,))


def test_arguments_holding_the_scripts_objects_are_pickled_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plain pickler met the script's object (it pickles by reference, which a worker
    cannot follow), and everything was pickled again by value: each ``__reduce__`` ran
    twice, and a list of 300,000 such objects took 2.6x the stdlib's time."""
    from fiberexec._serialize import dumps, script_objects

    monkeypatch.setattr(_Reduced, "__module__", "__main__")
    assert script_objects(([_Reduced(1), _Reduced(2)],), {})
    assert script_objects((), {"points": {"a": _Reduced(1)}})
    assert not script_objects(([1, 2], "x"), {"k": (3,)})
    import numpy as np  # an array is no list: it is not looked into, nor asked for truth

    assert not script_objects((np.ones(3), [np.ones(2)]), {"a": np.zeros((2, 2))})
    _Reduced.reduced = 0
    payload = dumps((([_Reduced(1), _Reduced(2)],), {}), what="arguments", by_value=True)
    assert _Reduced.reduced == 2  # once each
    monkeypatch.setattr(_Reduced, "__module__", __name__)  # (rebuilt here by reference)
    (values,), _ = loads(payload)
    assert [v.value for v in values] == [1, 2]


def test_arguments_around_a_kept_function_pickle_plainly_unless_they_hold_the_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the shard pickles a chunk of a map (`fiberexec._functions.kept_functions`): the
    function as its kept bytes, the items with the standard library's pickler; an item of
    the script's own, which that pickler would name as ``__main__``, sends everything by
    value, although the function's bytes say ``__main__`` too."""
    from fiberexec._functions import kept_functions
    from fiberexec._serialize import by_value_needed, dumps

    def scaled(x: Any) -> Any:
        return x * SCALE

    scaled.__module__ = "__main__"  # as a script's function: its bytes say so

    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

        def __mul__(self, k: int) -> int:
            return self.x * k

    Point.__module__, Point.__qualname__ = "__main__", "Point"
    monkeypatch.setattr(sys.modules["__main__"], "Point", Point, raising=False)

    def send(chunk: tuple[Any, ...]) -> tuple[Any, bool]:
        positional, marks = kept_functions((scaled, chunk))
        assert marks >= 1  # the function's bytes name __main__
        payload = dumps((positional, {}), what="arguments", functions_as_bytes=True,
                        main_marks=marks)
        return payload, by_value_needed(payload, marks)

    payload, by_value = send((1, 2))
    (fn, chunk), _ = loads(payload)
    assert [fn(x) for x in chunk] == [3, 6] and not by_value  # plainly pickled
    assert kept_functions((1, sum)) == ((1, sum), 0)  # nothing by value: as they were

    payload, by_value = send((Point(2),))  # the plain pickler finds __main__.Point here...
    monkeypatch.delattr(sys.modules["__main__"], "Point")  # ...a worker has no such name
    (fn, chunk), _ = loads(payload)
    assert fn(chunk[0]) == 6 and by_value  # the point came by value, and the function


def test_a_map_pickles_its_function_once_for_all_its_batches() -> None:
    """Its tasks read the globals as they were when its first tasks were sent (a stdlib
    worker reads what it forked); without a map, each batch is pickled anew."""
    from fiberexec._serialize import Snapshot

    def total() -> float:
        return sum(WEIGHTS)

    snapshot = Snapshot()
    first = dumps_function(total, snapshot)
    WEIGHTS.append(4.0)
    try:
        assert dumps_function(total, snapshot) is first
        assert loads(first)() == 3.0
        assert loads(dumps_function(total, Snapshot()))() == 7.0  # the next map's
        assert loads(dumps_function(total))() == 7.0
    finally:
        WEIGHTS.pop()


BIG = {i: float(i) for i in range(200_000)}  # a pickle long enough to travel apart


@pytest.mark.filterwarnings("ignore::fiberexec.PerformanceWarning")  # (said: tested above)
def test_a_worker_rebuilds_a_function_with_a_long_pickle_once_for_the_same_bytes() -> None:
    """It came with every batch of a map and was unpickled each time (10 ms a batch for
    this table); a changed table is a new function, and only the last two are kept."""
    from fiberexec import _functions
    from fiberexec._serialize import streamed_apart

    def look(i: int) -> float:
        return BIG[i]

    payload = dumps_function(look)
    assert streamed_apart(payload)
    fn = _functions.load(payload)
    assert _functions.load(dumps_function(look)) is fn and fn(7) == 7.0
    BIG[7] = -1.0
    try:
        changed = _functions.load(dumps_function(look))
        assert changed is not fn and changed(7) == -1.0
        for value in (-2.0, -3.0):
            BIG[7] = value
            assert _functions.load(dumps_function(look))(7) == value
        assert len(_functions._large) == _functions.LARGE_MAX
    finally:
        BIG[7] = 7.0


CYCLE = """
import gc
from fiberexec._serialize import dumps

def hold():
    payload = dumps({i: float(i) for i in range(200_000)})  # a long pickle: it travels apart
    try:
        raise ValueError
    except ValueError as exc:
        kept = exc  # its traceback holds this frame, which holds it and the payload

gc.disable()
for _ in range(4):
    hold()
gc.collect()
print("collected")
"""


def test_a_long_payload_in_a_garbage_cycle_is_collected() -> None:
    """Its buffers were views of views (one holding an export on the other), and CPython's
    collector clearing such a view in a cycle left a NULL that the release then followed:
    a segfault. In a process of its own, with the allocator's checks on."""
    import os
    import subprocess

    done = subprocess.run([sys.executable, "-c", CYCLE], capture_output=True, text=True,
                          env={**os.environ, "PYTHONMALLOC": "debug"}, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout) == (0, "collected\n"), done.stderr[-2000:]
