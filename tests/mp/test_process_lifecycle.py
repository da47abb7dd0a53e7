"""How a process starts and ends, as the standard library's: what the parent keeps, what
the child waits for before it exits, what it inherits, and what a pool raises."""

from __future__ import annotations

import gc
import multiprocessing
import signal
import subprocess
import sys
import weakref
from multiprocessing import util
from pathlib import Path
from types import ModuleType

import pytest

from tests.mp import compat_tasks as c
from tests.mp import exit_tasks as t
from tests.mp.compat import STARTS, mpm

__all__ = ["mpm"]


def test_before_start_there_is_no_sentinel_and_after_it_the_target_is_let_go(
        mpm: ModuleType) -> None:
    target = t.Target()
    watch = weakref.ref(target)
    p = mpm.Process(target=target)
    assert p._popen is None  # code written for the stdlib checks this
    with pytest.raises(ValueError, match="not started"):
        _ = p.sentinel
    p.start()
    del target
    p.join(60)
    gc.collect()
    assert watch() is None
    assert p.exitcode == 0


def test_a_joined_and_closed_process_is_collected_as_soon_as_it_is_dropped(
        mpm: ModuleType) -> None:
    # CPython's test_close does this once; nothing else (a backend's exit watch, say) may
    # still hold the object when join returns, however the threads are scheduled
    for _ in range(STARTS):
        p = mpm.Process(target=t.Target())
        p.start()
        p.join(60)
        assert p.exitcode == 0
        p.close()
        watch = weakref.ref(p)
        del p
        gc.collect()
        assert watch() is None


def test_the_stdlib_kill_and_terminate_work_on_the_process(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    for method, code in ((multiprocessing.Process.kill, -9),
                         (multiprocessing.Process.terminate, -15)):
        event = ctx.Event()
        p = ctx.Process(target=event.wait, args=(60,))
        p.start()
        method(p)  # type: ignore[arg-type]
        p.join(60)
        assert p.exitcode == code


def test_a_process_terminated_as_it_starts_is_alive_only_with_a_pid(mpm: ModuleType) -> None:
    """The stdlib's pool, terminating, formats the pid of each worker still alive: a
    process told to end before its child could report its pid (a container still
    starting) is alive once it has one, and not alive if it never gets one."""
    for _ in range(3):
        p = mpm.Process(target=c.sleep_long)
        p.start()
        p.terminate()
        if p.is_alive():
            assert isinstance(p.pid, int)
        p.join(60)
        assert not p.is_alive() and p.exitcode is not None


def test_a_child_waits_for_its_threads_before_it_exits(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    event = ctx.Event()
    p = ctx.Process(target=t.set_later, args=(event, 0.5))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert event.is_set()


def test_a_child_gets_the_stdlib_logger_level_and_its_parent(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    made = util._logger  # type: ignore[attr-defined]
    logger = multiprocessing.get_logger()
    before, handlers = logger.level, list(logger.handlers)
    logger.setLevel(33)
    try:
        here, there = ctx.Pipe(duplex=False)
        for target, expected in ((t.report_log_level, 33), (t.report_parent, None)):
            p = ctx.Process(target=target, args=(there,))
            p.start()
            got = here.recv()
            p.join(60)
            if expected is None:  # the parent, asked through the stdlib's own function
                assert got == (mpm.current_process().pid)
            else:
                assert got == expected
    finally:  # the stdlib's logger as it was (later tests' children inherit it, as ours do)
        logger.setLevel(before)
        logger.handlers[:] = handlers
        util._logger = made  # type: ignore[attr-defined]


def test_a_pool_raises_what_the_pickler_raised(mpm: ModuleType) -> None:
    with mpm.Pool(1) as pool, pytest.raises(RuntimeError, match="refuses to be pickled"):
        pool.map(t.identity, [t.Unpicklable()])


def test_a_pool_dropped_while_running_warns(mpm: ModuleType) -> None:
    pool = mpm.Pool(1)
    assert pool.apply(t.identity, (5,)) == 5
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        pool.__del__()
    pool.terminate()
    pool.join()


def test_a_child_that_cannot_unpickle_its_process_exits_with_1(mpm: ModuleType) -> None:
    p = mpm.get_context("spawn").Process(target=t.identity, args=(t.UnpicklableThere(),))
    p.start()
    p.join(60)
    assert p.exitcode == 1


def test_the_popen_object_knows_the_child(mpm: ModuleType) -> None:
    ctx = mpm.get_context("spawn")
    event = ctx.Event()
    p = ctx.Process(target=event.wait, args=(60,))
    p.start()
    assert p._popen.pid == p.pid
    assert p._popen.poll() is None
    event.set()
    assert p._popen.wait(60) == 0 == p.exitcode


@pytest.mark.parametrize(("name", "label"), [
    ("Process-1", "Process-1"),
    ("_DoomedManager-server-0", "DoomedManager-server-0"),
    ("my env: 3/4", "my_env_3_4"),
    ("ünïcode.", "n_code"),
    ("x" * 80, "x" * 63),
    ("___", ""),
])
def test_a_process_name_becomes_a_label_every_backend_takes(name: str, label: str) -> None:
    """Kubernetes rejects a pod whose label value starts or ends with anything but a letter
    or digit, holds other characters than ``-_.``, or is longer than 63."""
    from fiberexec.multiprocessing._process import label_value

    assert label_value(name) == label


CTRL_C = """
import os, signal, sys, threading, time
import {module} as mp


def forever():
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    os.setpgid(0, 0)  # a terminal's foreground group: Ctrl-C signals all of it
    p = mp.Process(target=forever)
    p.start()
    time.sleep(0.5)
    threading.Timer(0.2, os.killpg, (os.getpgrp(), signal.SIGINT)).start()
    p.join()
"""


@pytest.mark.parametrize("module", ["multiprocessing", "fiberexec.multiprocessing"])
def test_the_terminals_ctrl_c_ends_a_child_as_it_ends_its_parent(
        tmp_path: Path, module: str) -> None:
    """A child is in its parent's process group: Ctrl-C (SIGINT to the group) interrupts it
    too, so the parent's exit, which joins its children, does not wait forever."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C.format(module=module))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == -signal.SIGINT, done.stderr  # the parent ended by Ctrl-C
    assert "in forever" in done.stderr  # and the child too, in its target


def test_a_process_whose_arguments_cannot_be_pickled_raises_what_the_pickler_raised(
        mpm: ModuleType) -> None:
    import threading

    p = mpm.get_context("spawn").Process(target=t.Target(), args=(threading.Lock(),))
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        p.start()


def test_a_processs_repr_is_the_stdlibs(mpm: ModuleType) -> None:
    import re

    from tests.mp import compat_tasks

    p = mpm.Process(target=compat_tasks.sleep_long, name="x")
    assert re.fullmatch(r"<Process name='x' parent=\d+ initial>", repr(p))
    p.start()
    assert p.pid  # (a repr does not wait for a pid the child has not reported yet)
    assert re.fullmatch(r"<Process name='x' pid=\d+ parent=\d+ started>", repr(p))
    p.terminate()
    p.join(60)
    assert re.fullmatch(r"<Process name='x' pid=\d+ parent=\d+ stopped exitcode=-SIGTERM>",
                        repr(p))
    p.close()
    assert re.fullmatch(r"<Process name='x' parent=\d+ closed>", repr(p))
