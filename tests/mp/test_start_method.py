"""The start method ``"fiber"`` in the standard library (`fiberexec._start_method`): a library
that takes a start method's name runs on fiberexec when given ``"fiber"``, as it runs on the
standard library when given ``"spawn"``; ``multiprocessing.set_start_method("fiber")`` moves
a whole standard library program onto fiberexec."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import signal
import stat
import subprocess
import sys
from typing import Any

import pytest

import fiberexec.multiprocessing as fmp
from tests.conftest import BACKEND


def _env_worker(conn: Any, seed: int) -> None:
    """One environment of `VectorEnv`, as a library's worker loop is written."""
    state = seed
    while True:
        command, data = conn.recv()
        if command == "step":
            state = (state * 31 + data) % 1000
            conn.send((state, multiprocessing.current_process().name))
        elif command == "close":
            conn.close()
            return


class VectorEnv:
    """A vector environment as RL libraries write theirs (Stable-Baselines3's
    ``SubprocVecEnv``, tianshou's ``SubprocVectorEnv``): the start method is a name the
    library looks up in the standard library's `multiprocessing`."""

    def __init__(self, count: int, start_method: str) -> None:
        ctx = multiprocessing.get_context(start_method)
        self.remotes, self.processes = [], []
        for seed in range(count):
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=_env_worker, args=(theirs, seed), daemon=True,
                                  name=f"env-{seed}")
            process.start()
            theirs.close()
            self.remotes.append(mine)
            self.processes.append(process)

    def step(self, actions: list[int]) -> list[tuple[int, str]]:
        for remote, action in zip(self.remotes, actions, strict=True):
            remote.send(("step", action))
        return [remote.recv() for remote in self.remotes]

    def close(self) -> list[int | None]:
        for remote in self.remotes:
            remote.send(("close", None))
        for process in self.processes:
            process.join(60)
        return [process.exitcode for process in self.processes]


@pytest.mark.parametrize("method", ["spawn", "fiber"])
def test_a_library_given_a_start_method_name_runs_on_it(method: str) -> None:
    env = VectorEnv(3, method)
    try:
        first = env.step([1, 2, 3])
        second = env.step([4, 5, 6])
    finally:
        codes = env.close()
    assert first == [(1, "env-0"), (33, "env-1"), (65, "env-2")]
    assert second == [(35, "env-0"), (1028 % 1000, "env-1"), (2021 % 1000, "env-2")]
    assert codes == [0, 0, 0]
    ours = all(isinstance(p, fmp.Process) for p in env.processes)
    assert ours == (method == "fiber")


def test_the_name_gives_this_modules_context_and_comes_back() -> None:
    ctx = multiprocessing.get_context("fiber")
    assert ctx is fmp.get_context("fiber")
    assert ctx.get_start_method() == "fiber"
    assert multiprocessing.get_context(ctx.get_start_method()) is ctx
    assert ctx.Process is fmp.Process
    assert "fiber" in fmp.get_all_start_methods()
    # the standard library's own list is its own: code that checks it sees what it expects
    assert "fiber" not in multiprocessing.get_all_start_methods()


def test_importing_fiberexec_alone_makes_the_name_known() -> None:
    """`import fiberexec` takes milliseconds: the multiprocessing layer is imported only when
    the context is first used."""
    program = (
        "import sys, multiprocessing, fiberexec\n"
        "ctx = multiprocessing.get_context('fiber')\n"
        "from multiprocessing.context import BaseContext\n"
        "print(isinstance(ctx, BaseContext), 'fiberexec.multiprocessing' in sys.modules)\n"
        "print(ctx.get_start_method())\n"
        "import fiberexec.multiprocessing as fmp\n"
        "now = multiprocessing.get_context('fiber')\n"
        "print(ctx.Process is fmp.Process, now is fmp.get_context('fiber'))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["True False", "fiber", "True True"]


def _square_to(queue: Any, value: int) -> None:
    queue.put(value * value)


@pytest.mark.parametrize("method", ["spawn", "fiber"])
def test_a_library_that_takes_a_context_object_accepts_this_one(method: str) -> None:
    """Libraries that take a context object check that it is one of the standard library's
    (torch's ``DataLoader(multiprocessing_context=ctx)`` refuses anything else), then start
    their workers from it; the name ``"fiber"`` gives one, as ``"spawn"`` does."""
    ctx = multiprocessing.get_context(method)
    assert isinstance(ctx, multiprocessing.context.BaseContext)
    queue = ctx.Queue()
    process = ctx.Process(target=_square_to, args=(queue, 7))
    process.start()
    try:
        assert queue.get(timeout=60) == 49
    finally:
        process.join(60)
    assert process.exitcode == 0
    assert isinstance(process, fmp.Process) == (method == "fiber")


def test_without_fiberexec_the_name_is_unknown() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import multiprocessing; multiprocessing.get_context('fiber')"],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "cannot find context for 'fiber'" in done.stderr


@pytest.mark.slow
def test_set_start_method_fiber_moves_a_stdlib_program_onto_fiberexec() -> None:
    def run(method: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "tests.mp.start_method_program", method],
                              capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    stdlib, ours = run("spawn"), run("fiber")
    assert stdlib[0] == "start method: spawn" and ours[0] == "start method: fiber"
    assert stdlib[-1] == "on fiberexec: False" and ours[-1] == "on fiberexec: True"
    assert stdlib[1:-1] == ours[1:-1]
    assert "from the child: (4, 'env-0') 40" in ours
    assert "SystemExit(3): 3" in ours and "terminated: -15" in ours
    assert "children left: []" in ours


@pytest.mark.slow
def test_after_set_start_method_the_stdlibs_own_contexts_still_start_children() -> None:
    """A library that picks the standard library's ``spawn`` or ``forkserver`` context for
    itself, in a program that set its own start method: each child is told the parent's
    method before it imports anything of the parent's (it failed with "cannot find context
    for 'fiber'"); the output is the same as under the stdlib's ``forkserver``."""
    def run(method: str) -> list[str]:
        # its own session: a child that never starts leaves the stdlib's pool waiting for
        # ever, and what it started goes with it
        with subprocess.Popen([sys.executable, "-m", "tests.mp.other_context_program", method],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as program:
            try:
                out, err = program.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(program.pid, signal.SIGKILL)
                out, err = program.communicate()
                pytest.fail(f"{method}: still running after 60 s; it wrote {out!r}, {err!r}")
        assert program.returncode == 0, err
        assert "Error" not in err, err
        return out.splitlines()

    stdlib, ours = run("forkserver"), run("fiber")
    assert ours == stdlib
    assert "spawn pool: [3, 2, 1] spawn" in ours
    assert "forkserver process exit code: 0" in ours


@pytest.mark.parametrize("method", ["spawn", "fiber"])
def test_the_stdlibs_own_pool_runs_on_the_context_it_is_given(method: str) -> None:
    """The pool `multiprocessing.Pool()` makes after ``set_start_method("fiber")``: the
    standard library's, its queues made by the context it is given."""
    ctx = multiprocessing.get_context(method)
    with multiprocessing.pool.Pool(2, context=ctx) as pool:
        assert pool.map(abs, range(-40, 0)) == list(range(40, 0, -1))
        assert pool.apply(divmod, (7, 2)) == (3, 1)
        with pytest.raises(ZeroDivisionError):
            pool.apply(divmod, (1, 0))
        if method == "fiber" and BACKEND == "local":  # every process on this host:
            # its tasks and results pass through OS pipes, as in the standard library
            fd = pool._inqueue._reader.fileno()  # type: ignore[attr-defined]
            assert stat.S_ISFIFO(os.fstat(fd).st_mode)
