"""The launcher learns the installed modules workers on this host imported: workers forked
after that start with them (`fiberexec._imports`), with numpy's global generator seeded
afresh, and never when an executor's ``env=`` could change what a module reads on import.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from pathlib import Path

import pytest

from fiberexec import FiberExecutor, _imports
from fiberexec.backend import shared_launchers
from fiberexec.backends.local import LocalBackend
from tests import tasks

MODULE = "graphlib"  # a standard library module nothing else imports (nor other tests)


def _fresh(name: str) -> None:
    """Forget ``name`` in this process, so that importing it again is seen."""
    sys.modules.pop(name, None)


def test_only_installed_modules_count(tmp_path: Path) -> None:
    import graphlib

    assert graphlib.__file__ is not None and _imports.installed(graphlib.__file__)
    assert _imports.installed(importlib.import_module("numpy").__file__ or "")
    assert not _imports.installed(tasks.__file__ or "")
    (tmp_path / "mine_for_a_test.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        _fresh(MODULE)
        watch = _imports.ImportWatch()
        importlib.import_module(MODULE)
        importlib.import_module("mine_for_a_test")  # the user's own: not for the launcher
        found = watch.new()
        assert [name for name, _ in found] == [MODULE]
        assert watch.new() == []  # each once
        assert watch.count == len(sys.modules)
    finally:
        sys.path.remove(str(tmp_path))
        _fresh("mine_for_a_test")


def test_the_launcher_imports_a_module_only_from_the_file_a_worker_loaded() -> None:
    origin = importlib.import_module(MODULE).__file__
    assert origin is not None
    elsewhere = os.path.join(os.path.dirname(origin), "wave.py")  # installed, another file
    _fresh(MODULE)
    assert not _imports.import_learned([(MODULE, elsewhere)])
    assert MODULE not in sys.modules
    assert not _imports.import_learned([("no_such_module_anywhere", origin)])
    assert _imports.import_learned([(MODULE, origin)])
    assert MODULE in sys.modules


def test_the_program_keeps_installed_modules_and_teaches_each_once() -> None:
    origin = importlib.import_module(MODULE).__file__
    assert origin is not None
    _imports.learn([(MODULE, origin), ("mine", "/nowhere/mine.py")])
    taught: set[str] = set()
    first = _imports.learned_since(taught)
    assert (MODULE, origin) in first and all(name != "mine" for name, _ in first)
    assert MODULE not in {name for name, _ in _imports.learned_since(taught)}


def test_a_worker_host_learns_the_names_installed_there() -> None:
    """What an executor on another host names (`names_to_teach`) is resolved where its
    workers run (`learn_names`): installed modules found there, without importing them;
    never the program's own, a name that is none, or one not there."""
    from fiberexec.backend import learn_names, names_to_teach

    name = "tomllib"  # installed (the standard library), imported by nothing of ours
    _fresh(name)
    taught = {n for n, _ in _imports.learned_since(set())}  # what earlier tests taught
    learn_names([name, "tests", "not a name", "no_such_module_anywhere", "__main__", 3])
    assert names_to_teach(taught) == [name]
    assert name not in sys.modules  # looked up, not imported
    assert names_to_teach(taught) == []  # each once


def _own_launcher(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Give this test a launcher of its own, started now. pytest sets PYTEST_CURRENT_TEST for
    each test: with a launcher another test started, every request from this one differs
    from its environment by that variable, and learns nothing (see `Launcher.spawn`). Its
    preload, ``module``, is one every worker imports anyway; with one set, every worker is
    forked by the launcher, the first ones too."""
    monkeypatch.setenv("FIBEREXEC_PRELOAD", module)


def _learn_through(name: str) -> None:
    """A worker imports ``name``; its report comes before the next result on its link."""
    with FiberExecutor(1, backend=LocalBackend()) as ex:
        ex.submit(tasks.import_module, name).result(timeout=60)
        ex.submit(tasks.pid).result(timeout=60)


def test_workers_forked_after_a_worker_imported_a_module_start_with_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _own_launcher(monkeypatch, "string")
    _learn_through(MODULE)
    with FiberExecutor(2, backend=LocalBackend()) as ex:
        answers = list(ex.map(tasks.import_module, [MODULE] * 4, [0.1] * 4, timeout=60))
    assert all(had for _, _, had in answers), answers
    learning = {parent for _, parent, _ in answers}
    assert learning <= set(shared_launchers.pids())
    # An executor's env= may change what a module reads as it is imported: its workers
    # come from a launcher that learns nothing. (The numerical libraries' thread variables
    # have launchers of their own, which learn: tests/test_threads.py.)
    with FiberExecutor(2, backend=LocalBackend(), env={"A_SETTING_OF_MINE": "1"}) as ex:
        answers = list(ex.map(tasks.import_module, [MODULE] * 4, [0.1] * 4, timeout=60))
    first: dict[int, bool] = {}  # each worker's first task (a worker runs its own in order)
    for pid, _, had in answers:
        first.setdefault(pid, had)
    assert not any(first.values()), answers
    other = {parent for _, parent, _ in answers}
    assert other <= set(shared_launchers.pids()) and not other & learning


def test_workers_forked_with_numpy_draw_different_numbers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's global generator, made when the launcher imported numpy, is seeded afresh in
    each worker: workers that imported numpy themselves drew different numbers too."""
    _own_launcher(monkeypatch, "textwrap")
    _learn_through("numpy")
    draws: dict[int, float] = {}
    with FiberExecutor(2, backend=LocalBackend()) as ex:
        for _ in range(5):  # (bounded: until both workers answered)
            for pid, had, value in ex.map(tasks.numpy_draw, [0.1] * 4, timeout=60):
                assert had, "a worker forked after numpy was learned did not have it"
                draws[pid] = value
            if len(draws) == 2:
                break
    assert len(draws) == 2 and len(set(draws.values())) == 2, draws


def test_a_watch_looks_at_every_name_once_a_module_was_removed(tmp_path: Path) -> None:
    """It looks only at the names added since its last look, unless one was removed
    meanwhile: then the last names are not all new, and it looks at all of them."""
    for name in ("first_for_a_test", "second_for_a_test"):
        (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("first_for_a_test")
        watch = _imports.ImportWatch()
        del sys.modules["first_for_a_test"]  # as some libraries do; the count stays
        _fresh(MODULE)
        importlib.import_module(MODULE)
        importlib.import_module("second_for_a_test")
        assert MODULE in [name for name, _ in watch.new()]  # not only the last one added
        assert watch.new() == []  # each once
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("first_for_a_test", "second_for_a_test"):
            _fresh(name)


TAUGHT = "colorsys"  # a standard library module nothing else here imports


def test_a_function_is_read_for_the_installed_modules_loading_it_imports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """By reference, the modules its module's globals come from (importing that module
    imports them), never the program's own; by value (defined in the script), those its
    code names; through a partial, a bound method or a callable object alike."""
    (tmp_path / "reads_for_a_test.py").write_text(
        "import colorsys\nfrom graphlib import TopologicalSorter\n"
        "def f(x):\n    return x\n"
        "class C:\n    def m(self):\n        return 1\n    def __call__(self):\n        return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reads = importlib.import_module("reads_for_a_test")
    import colorsys
    import graphlib

    expected = {TAUGHT: colorsys.__file__, "graphlib": graphlib.__file__}
    for fn in (reads.f, functools.partial(reads.f, 1), reads.C().m, reads.C(), reads.C):
        found = dict(_imports.needed_by(fn))
        assert {name: found.get(name) for name in expected} == expected, fn
        assert "reads_for_a_test" not in found  # the user's own code
    script = types.FunctionType(
        compile("def g():\n    return colorsys.hsv_to_rgb(0, 0, 0)\n", "<script>", "exec")
        .co_consts[0], {"__name__": "__main__", "colorsys": colorsys, "graphlib": graphlib})
    assert _imports.needed_by(script) == [(TAUGHT, colorsys.__file__)]  # not graphlib
    assert _imports.needed_by(pow) == [] and _imports.needed_by(object()) == []


def _recording(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, watched: str,
               body: str) -> types.ModuleType:
    """A module of the program's own, ``name``, that imports the installed ``watched`` and
    records as it is loaded whether that was there already (``HAD``), then ``body``."""
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nHAD = {watched!r} in sys.modules\nimport {watched}\n{body}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_the_first_task_teaches_the_launcher_before_it_forks_the_workers(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pool's workers start with the installed modules its first task's function needs,
    imported once by the launcher, as a forked stdlib worker has them from its parent; an
    executor whose ``env=`` may change an import's outcome has its workers import them."""
    _own_launcher(monkeypatch, "keyword")
    taught = _recording(monkeypatch, tmp_path, "taught_for_a_test", TAUGHT,
                        "def had():\n    return HAD\n")
    with FiberExecutor(4, backend=LocalBackend()) as ex:
        had = {f.result(timeout=60) for f in [ex.submit(taught.had) for _ in range(40)]}
    assert True in had, had  # (a program's first workers start afresh, the rest forked)
    with FiberExecutor(2, backend=LocalBackend(), env={"A_SETTING_OF_MINE": "1"}) as ex:
        assert not any(f.result(timeout=60) for f in [ex.submit(taught.had) for _ in range(8)])


def test_a_process_starts_with_the_installed_modules_its_target_needs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `fiberexec.multiprocessing.Process` is forked from the launcher too: what its
    target's module imports, the launcher imports once before it forks the child, as a
    stdlib child forked from its parent has it."""
    import fiberexec.multiprocessing as fmp

    _own_launcher(monkeypatch, "shlex")
    target = _recording(monkeypatch, tmp_path, "target_for_a_test", "sched",
                        "def report(q):\n    q.put(HAD)\n")
    q = fmp.Queue()
    child = fmp.Process(target=target.report, args=(q,))
    child.start()
    try:
        assert q.get(timeout=60) is True
    finally:
        child.join(60)
    assert child.exitcode == 0


def test_a_pool_started_with_an_initializer_is_taught_what_it_needs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A `Pool` with an initializer starts its workers before any task: the initializer
    teaches the launcher instead."""
    import fiberexec.multiprocessing as fmp

    _own_launcher(monkeypatch, "tokenize")
    init = _recording(monkeypatch, tmp_path, "init_for_a_test", "quopri",
                      "def init():\n    pass\ndef had(_):\n    return HAD\n")
    with fmp.Pool(2, initializer=init.init) as pool:
        pool.wait_until_workers_up(60)  # (before any task's function is known)
        assert all(pool.map(init.had, range(8)))
