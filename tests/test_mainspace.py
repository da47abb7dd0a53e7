"""`fiberexec._mainspace`: a worker's ``__main__`` holds the script's functions and classes
that tasks brought by value, so the stdlib's pickler finds them by reference. (End to end,
with real scripts and workers: tests/behaviour/test_script_pickles.py.)"""

from __future__ import annotations

import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from fiberexec import _mainspace
from fiberexec._serialize import dumps_function
from fiberexec.worker import _Functions

SCRIPT = """
class Point:
    def __init__(self, x):
        self.x = x

def double(x):
    return 2 * x

def uses(x):
    return double(Point(x).x)

square = lambda x: x * x
"""


@pytest.fixture
def main() -> Iterator[types.ModuleType]:
    """A fresh worker ``__main__``; the test process's own is put back afterwards."""
    before, adopted = sys.modules["__main__"], dict(_mainspace.adopted)
    _mainspace.adopted.clear()
    try:
        yield _mainspace.install()
    finally:
        sys.modules["__main__"] = before
        _mainspace.adopted.clear()
        _mainspace.adopted.update(adopted)


def by_value(obj: Any) -> Any:
    """What a worker gets: a copy of ``obj`` rebuilt by cloudpickle (never the original)."""
    return pickle.loads(cloudpickle.dumps(obj))


def script() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(SCRIPT, namespace)  # a script's functions: __module__ == "__main__"
    return namespace


def test_a_function_and_what_it_calls_become_main_names(main: types.ModuleType) -> None:
    uses = by_value(script()["uses"])
    _mainspace.adopt(uses)
    assert main.uses is uses
    assert main.double is uses.__globals__["double"]
    assert main.Point is uses.__globals__["Point"]
    assert pickle.loads(pickle.dumps(main.double)) is main.double  # by reference, found
    assert uses(4) == 8


def test_lambdas_and_methods_have_no_top_level_name(main: types.ModuleType) -> None:
    namespace = script()
    _mainspace.adopt([by_value(namespace["square"]), by_value(namespace["Point"])])
    assert sorted(_mainspace.adopted) == ["Point"]
    assert not hasattr(main, "<lambda>")
    assert _mainspace.current(namespace["square"])  # nothing to adopt again for it
    with pytest.raises(AttributeError, match="has no attribute 'square'"):
        main.square  # noqa: B018


def test_a_class_deep_in_data_is_found_when_asked(main: types.ModuleType) -> None:
    """Past the walk's budget, the class is still found: cloudpickle rebuilt it here."""
    point = by_value(script()["Point"])
    deep = [list(range(_mainspace.BUDGET))] * 2 + [point(1)]
    _mainspace.adopt(deep[:2])
    assert "Point" not in _mainspace.adopted
    assert pickle.loads(pickle.dumps(deep[2])).x == 1  # asks __main__ for Point: found
    assert main.Point is point


def test_an_argument_copy_of_the_functions_global_is_that_global(
        main: types.ModuleType) -> None:
    namespace = script()
    uses, double = by_value(namespace["uses"]), by_value(namespace["double"])
    _mainspace.adopt(uses)
    args, kwargs = _mainspace.settle((double, 3), {"fn": by_value(namespace["double"])})
    assert args[0] is kwargs["fn"] is main.double is uses.__globals__["double"]
    assert args[1] == 3


def test_a_changed_function_takes_its_name(main: types.ModuleType) -> None:
    first = by_value(script()["double"])
    _mainspace.adopt(first)
    changed = script()
    exec("def double(x):\n    return 3 * x", changed)  # the script edited
    second = by_value(changed["double"])
    args, _ = _mainspace.settle((second,), {})
    assert args[0] is main.double and args[0].__code__ is second.__code__
    assert args[0](2) == 6
    assert not _mainspace.current(first)


STATE = """
MODEL = None
SEEN = {}
SCALE = 1

def init(model):
    global MODEL
    MODEL = model
    SEEN["init"] = model

def predict(x):
    return MODEL, dict(SEEN), x * SCALE
"""


def test_functions_share_main_and_keep_what_the_worker_set(main: types.ModuleType) -> None:
    """As in a stdlib worker, an initializer's globals are there for the tasks after it,
    though each function came in a pickle of its own, with the values the caller had."""
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE, caller)
    _mainspace.home(by_value(caller["init"]))("net")
    predict = _mainspace.home(by_value(caller["predict"]))
    assert predict(2) == ("net", {"init": "net"}, 2)
    assert main.MODEL == "net" and predict.__globals__ is vars(main)


def test_a_global_the_caller_changed_since_it_was_sent_wins(main: types.ModuleType) -> None:
    """Unless the worker changed it too: see the next test."""
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE, caller)
    predict = by_value(caller["predict"])
    assert _mainspace.home(predict)(2) == (None, {}, 2)
    caller["SCALE"] = 10  # bound again in the script
    caller["SEEN"]["caller"] = 1  # changed in place there
    assert _mainspace.home(by_value(caller["predict"]))(2) == (None, {"caller": 1}, 20)


def test_a_global_the_worker_changed_keeps_the_workers_value(main: types.ModuleType) -> None:
    """As in a stdlib worker: what an initializer bound (a connection, a model) or filled
    (a cache) stays the worker's, though the script sets or fills its own copy since."""
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE, caller)
    _mainspace.home(by_value(caller["init"]))("net")
    caller["init"]("the script's own")  # the script sets up its own the same way
    caller["SCALE"] = 10  # and changes what the worker never did
    assert _mainspace.home(by_value(caller["predict"]))(2) == ("net", {"init": "net"}, 20)
    caller["SEEN"] = {"bound": "again"}
    assert _mainspace.home(by_value(caller["predict"]))(2) == ("net", {"init": "net"}, 20)


def test_functions_of_one_message_each_read_the_globals_they_brought(
        main: types.ModuleType) -> None:
    """Two maps' functions in one message to a worker, sent with ``SCALE`` 1 and then 2:
    a task of the first map that runs after one of the second reads 1, as sent, though the
    message unpickled its function once (`fiberexec.worker._Functions`)."""
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE, caller)
    caller["SCALE"] = 1
    first = dumps_function(caller["predict"])
    caller["SCALE"] = 2
    second = dumps_function(caller["predict"])
    functions = _Functions([first, second])
    assert [functions.get(i)(1)[2] for i in (0, 1, 0, 0, 1)] == [1, 2, 1, 1, 2]
    assert functions.get(0) is functions.get(0)  # nothing put since: the one made before


def test_a_global_the_worker_set_before_the_caller_sent_it_stays(
        main: types.ModuleType) -> None:
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE, caller)
    main.MODEL = "set by a task through globals()"
    assert _mainspace.home(by_value(caller["predict"]))(2)[0] == (
        "set by a task through globals()")


def test_a_decorated_functions_wrapped_function_reads_main_too(
        main: types.ModuleType) -> None:
    caller: dict[str, Any] = {"__name__": "__main__"}
    exec(STATE + """
import functools

def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper

@logged
def model():
    return MODEL
""", caller)
    _mainspace.home(by_value(caller["init"]))("net")
    assert _mainspace.home(by_value(caller["model"]))() == "net"


def test_the_program_that_was_main_stays_importable() -> None:
    program = types.ModuleType("__main__")
    program.__spec__ = types.SimpleNamespace(name="some_program_for_this_test")  # type: ignore
    before = sys.modules["__main__"]
    sys.modules["__main__"] = program
    try:
        _mainspace.install()
        assert sys.modules["some_program_for_this_test"] is program
        assert sys.modules["__main__"] is not program
    finally:
        sys.modules["__main__"] = before
        sys.modules.pop("some_program_for_this_test", None)


def test_the_program_that_was_main_is_its_packages_attribute() -> None:
    """``import pkg.program`` binds ``pkg`` and reads ``program`` off it: a task importing
    the worker's own module (``python -m fiberexec.worker``) finds it there."""
    package = types.ModuleType("pkg_for_this_test")
    program = types.ModuleType("__main__")
    program.__spec__ = types.SimpleNamespace(name="pkg_for_this_test.program")  # type: ignore
    before = sys.modules["__main__"]
    sys.modules["__main__"], sys.modules["pkg_for_this_test"] = program, package
    try:
        _mainspace.install()
        import pkg_for_this_test.program  # type: ignore[import-not-found]

        assert pkg_for_this_test.program is program
    finally:
        sys.modules["__main__"] = before
        sys.modules.pop("pkg_for_this_test.program", None)
        sys.modules.pop("pkg_for_this_test", None)


def test_a_fallback_answers_what_was_not_brought(main: types.ModuleType) -> None:
    _mainspace.install(fallback=lambda name: f"from the script: {name}")
    assert sys.modules["__main__"].anything == "from the script: anything"
    with pytest.raises(AttributeError):
        sys.modules["__main__"].__wrapped__  # noqa: B018  # dunders never reach it


def test_the_scripts_origin_names_it_for_a_spawned_child(main: types.ModuleType,
                                                         tmp_path: Any) -> None:
    """A stdlib ``spawn`` child reads ``__main__.__spec__.name``, else ``__file__``."""
    script = tmp_path / "train.py"
    script.write_text("")
    by_path = _mainspace.install({"path": str(script)})
    assert by_path.__file__ == str(script) and by_path.__spec__ is None
    elsewhere = _mainspace.install({"path": str(tmp_path / "not-on-this-host.py")})
    assert not hasattr(elsewhere, "__file__")
    by_name = _mainspace.install({"name": "pkg.train"})
    assert by_name.__spec__ is not None and by_name.__spec__.name == "pkg.train"


def test_what_the_caller_sent_under_its_names_goes_back_by_reference(
        main: types.ModuleType) -> None:
    """A task's function and the script's functions and classes it brought are the
    caller's under their names: a result may name them, as the stdlib's pickler does."""
    caller = script()
    uses = _mainspace.home(by_value(caller["uses"]))
    _mainspace.adopt(uses)
    assert _mainspace.by_reference()
    assert b"__main__" in pickle.dumps((main.Point(1), main.double, uses))


def test_a_class_the_worker_made_or_bound_sends_everything_by_value(
        main: types.ModuleType) -> None:
    caller = script()
    _mainspace.adopt(_mainspace.home(by_value(caller["uses"])))
    main.Made = type("Made", (), {"__module__": "__main__"})  # a task's own, in __main__
    assert not _mainspace.by_reference()  # the caller has no Made
    del main.Made
    assert _mainspace.by_reference()
    main.Point = type("Point", (), {"__module__": "__main__"})  # the worker's Point now
    assert not _mainspace.by_reference()


def test_a_class_reached_only_inside_data_sends_everything_by_value(
        main: types.ModuleType) -> None:
    """The caller may bind it to no name (made by a factory, say, and renamed)."""
    point = by_value(script()["Point"])
    _mainspace.settle((point(1),), {})
    assert main.Point is point
    assert not _mainspace.by_reference()


def test_nothing_goes_by_reference_without_a_workers_main() -> None:
    before = sys.modules["__main__"]
    try:
        sys.modules["__main__"] = types.ModuleType("__main__")
        assert not _mainspace.by_reference()
    finally:
        sys.modules["__main__"] = before


def test_a_function_reached_again_through_a_global_dict_keeps_its_name_here(
        main: types.ModuleType) -> None:
    """A dispatch table brings a copy of a function the task also names: walking into it
    must not take the name from the one on this namespace (results then went by value)."""
    caller = script()
    exec("HANDLERS = {'double': double}\ndef table(x):\n    return HANDLERS['double'](x), double",
         caller)
    table = _mainspace.home(by_value(caller["table"]))
    _mainspace.adopt(table)
    assert main.double.__globals__ is vars(main)
    assert _mainspace.by_reference()
    assert table(2)[0] == 4
