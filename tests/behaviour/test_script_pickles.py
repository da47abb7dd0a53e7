"""A task from the main script pickles the script's own functions and classes with the
standard library's pickler (``pickle.dumps``, a checkpoint, ``torch.save``, a
``multiprocessing.Pool`` inside the task), by reference as ``__main__.<name>``: in a stdlib
worker the names are there (it is a fork of the script); in a fiberexec worker they are the
copies the task brought by value (`fiberexec._mainspace`), and a spawned pool of the task
imports the script, as one of the script's own would. Same script, same output, for
the executors, for ``Process`` and for ``Pool``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.behaviour.both import under_test
from tests.behaviour.scripts import run_script

pytestmark = pytest.mark.timeout(240)

SCRIPT = """
import multiprocessing
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor


class Point:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Point and other.x == self.x


class Hidden:  # named by no task's code: reached only inside an argument
    def __init__(self, x):
        self.x = x


def double(x):
    return 2 * x


def main(x):  # a name the worker program itself uses
    return x


def round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


def checks(arg, fn):
    return [
        round_trip(Point(3)) == Point(3),
        round_trip(double) is double,
        round_trip(main) is main,
        [h.x for h in round_trip(arg["deep"])],
        round_trip(fn)(21),
        type(round_trip(arg["deep"][0])).__name__,
    ]


def pooled():  # a forked pool finds the script's names in its parent; a spawned one imports
    found = []  # the script (its __main__'s __file__) as __mp_main__
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            found.append(pool.map(double, range(4)))
    return found


def in_process(queue, arg, fn):
    queue.put(checks(arg, fn) + [pooled()])


if __name__ == "__main__":
    which, arg = sys.argv[1], {"deep": [Hidden(1), Hidden(2)]}
    if which in ("stdlib", "fiberexec"):
        if which == "fiberexec":
            from fiberexec import FiberExecutor as Executor
        else:
            Executor = ProcessPoolExecutor
        with Executor(2) as ex:
            print(ex.submit(checks, arg, double).result(timeout=120) +
                  [ex.submit(pooled).result(timeout=120)])
    else:
        if which == "fiberexec.multiprocessing":
            import fiberexec.multiprocessing as mp
        else:
            import multiprocessing as mp
        queue = mp.Queue()
        proc = mp.Process(target=in_process, args=(queue, arg, double))
        proc.start()
        print(queue.get(timeout=120))
        proc.join(60)
        with mp.Pool(2) as pool:
            print(pool.apply(checks, (arg, double)))
"""

EXPECTED = "[True, True, True, [1, 2], 42, 'Hidden', [[0, 2, 4, 6], [0, 2, 4, 6]]]"


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec", "multiprocessing",
                                              "fiberexec.multiprocessing"))
def test_a_task_pickles_the_scripts_objects_by_reference(tmp_path: Path, which: str) -> None:
    done = run_script(tmp_path, SCRIPT, which, timeout=200)
    lines = done.stdout.splitlines()
    assert lines[0] == EXPECTED, done.stdout + done.stderr
    if "multiprocessing" in which:  # then the pool's worker, without the nested pool
        assert lines[1] == EXPECTED.removesuffix(", [[0, 2, 4, 6], [0, 2, 4, 6]]]") + "]", (
            done.stdout)


RESULTS = """
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass


@dataclass
class Step:
    obs: float


def policy(x):
    return -x


def rollout(n):
    return [Step(float(i)) for i in range(n)], policy


class Slotted:
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


@dataclass(slots=True)
class Packed:
    x: int


@dataclass(frozen=True, slots=True)  # its __setattr__ holds the class before its slots
class Frozen:
    x: int


def slotted(a):
    return Slotted(a), Packed(a), Frozen(a)


class Outer:
    class Inner:
        pass


HANDLERS = {"policy": policy}  # a dispatch table: the function reached again, as a value


def nested(x):
    return Outer.Inner(), HANDLERS["policy"](x), policy


def made_here(x):  # a class of the worker's own, in its __main__: the caller has none
    globals()["Made"] = type("Made", (), {"__module__": "__main__"})
    return Made(), Step(x)


if __name__ == "__main__":
    if sys.argv[1] == "fiberexec":
        from fiberexec import FiberExecutor as Executor
    else:
        Executor = ProcessPoolExecutor
    with Executor(1) as ex:
        steps, fn = ex.submit(rollout, 3).result(timeout=120)
        print(steps == [Step(0.0), Step(1.0), Step(2.0)], type(steps[0]) is Step, fn is policy)
        one, packed, frozen = ex.submit(slotted, 5).result(timeout=120)
        print(type(one) is Slotted, one.a, packed == Packed(5), type(frozen) is Frozen)
        inner, value, fn = ex.submit(nested, 2).result(timeout=120)
        print(type(inner) is Outer.Inner, value, fn is policy)
        if sys.argv[1] == "fiberexec":
            made, step = ex.submit(made_here, 4.0).result(timeout=120)
            print(type(made).__name__, type(step) is Step, step.obs)
            steps, fn = ex.submit(rollout, 1).result(timeout=120)
            print(type(steps[0]) is Step, fn(1))
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_a_result_holds_the_callers_own_classes_and_functions(tmp_path: Path,
                                                              which: str) -> None:
    """The script's classes and functions in a result are the caller's own, by reference,
    as the stdlib's pickler sends them (and at its speed: no second pickle by value), slotted
    and nested ones too (a worker rebuilt them without their slots, or named ``Inner`` for
    ``Outer.Inner``), after a task that reached a script function through a dict; a class
    the worker made in its ``__main__``, which the caller lacks, comes by value."""
    lines = run_script(tmp_path, RESULTS, which, timeout=200).stdout.splitlines()
    assert lines[:3] == ["True True True", "True 5 True True", "True -2 True"]
    if which == "fiberexec":
        assert lines[3:] == ["Made True 4.0", "True -1"]


CLASS_KINDS = """
import functools
import sys
import typing
from concurrent.futures import ProcessPoolExecutor


class Point(typing.NamedTuple):
    x: int
    y: str = "d"


class Model:
    def __init__(self, k):
        self.k = k

    @functools.cached_property
    def squared(self):
        return self.k * self.k


class Plugin:
    names = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__name__ in Plugin.names:
            raise TypeError(f"plugin {cls.__name__!r} already registered")
        Plugin.names[cls.__name__] = cls


class Csv(Plugin):
    pass


def same(value):
    return value


def use(point, model, plugin):
    return point.x, model.squared, type(plugin).__name__, sorted(Plugin.names)


if __name__ == "__main__":
    if sys.argv[1] == "fiberexec":
        from fiberexec import FiberExecutor as Executor
    else:
        Executor = ProcessPoolExecutor
    with Executor(1) as ex:
        for _ in range(2):  # (the second time, the worker has the classes already)
            print(ex.submit(use, Point(2), Model(3), Csv()).result(timeout=120))
        point, model = ex.submit(same, Point(4)).result(timeout=120), Model(5)
        print(point, type(point) is Point, ex.submit(same, model).result(timeout=120).squared)
        print(type(ex.submit(same, Csv()).result(timeout=120)) is Csv, sorted(Plugin.names))
"""


@pytest.mark.parametrize("which", under_test("stdlib", "fiberexec"))
def test_script_classes_of_every_kind_travel_both_ways(tmp_path: Path, which: str) -> None:
    """A ``typing.NamedTuple`` (whose metaclass refuses ``__slots__`` in a class body), a
    class with a ``functools.cached_property`` (a lock inside, up to Python 3.11), and a
    subclass whose base registers it in ``__init_subclass__`` (run again at each
    unpickling, it refused the name it held) go to a task and come back, as with the
    stdlib."""
    lines = run_script(tmp_path, CLASS_KINDS, which, timeout=200).stdout.splitlines()
    assert lines == ["(2, 9, 'Csv', ['Csv'])", "(2, 9, 'Csv', ['Csv'])",
                     "Point(x=4, y='d') True 25", "True ['Csv']"]
