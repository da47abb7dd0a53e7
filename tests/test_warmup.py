"""The launcher learns the installed libraries its children import (`fiberexec._warmup`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LEARNING = """
import json, os, sys
sys.path.insert(0, sys.argv[1])  # the user's own module, beside the script
from fiberexec import FiberExecutor
from tests import tasks

# an installed library (the standard library's) and a module of the user's own
modules = ["sched", "users_own_module"]
rounds, first = [], {}
for _ in range(12):  # executors one after another, as a pool per generation
    with FiberExecutor(2) as ex:
        runs = [f.result(timeout=60) for f in [ex.submit(tasks.import_loaded, modules)
                                                for _ in range(4)]]
    rounds.append([(pid, parent != os.getpid(), loaded) for pid, parent, loaded in runs])
    for pid, forked, loaded in rounds[-1]:
        first.setdefault(pid, (forked, loaded))  # what a worker had before its first task
    if any(forked and loaded[0] for forked, loaded in first.values()):
        break
print(json.dumps(rounds), flush=True)
"""


def test_workers_forked_later_start_with_the_installed_libraries_tasks_imported(
        tmp_path: Path) -> None:
    """Executors made one after another: once a forked worker has imported an installed
    library for its tasks, the launcher imports it too, and workers forked after that start
    with it loaded. A module of the user's own (beside the script) is never preloaded: a
    new worker reads it afresh, edits included."""
    (tmp_path / "users_own_module.py").write_text("VALUE = 1\n")
    proc = subprocess.run([sys.executable, "-c", LEARNING, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(proc.stdout)
    first: dict[int, tuple[bool, list[bool]]] = {}  # each worker's first task
    for pid, forked, loaded in (run for runs in rounds for run in runs):
        first.setdefault(pid, (forked, loaded))
    assert any(forked and installed for forked, (installed, _own) in first.values()), rounds
    assert not any(users_own for _forked, (_installed, users_own) in first.values()), rounds
    assert len(rounds) > 1, rounds  # the first executor's workers learned it themselves


LEARNER = """
import json, os, select, sys, time
sys.path.insert(0, sys.argv[1])
from fiberexec import _warmup

_warmup.TRIAL_TIMEOUT = 3.0
learner = _warmup.Learner()
learner.writer.send("\\n".join(sys.argv[2:]).encode())  # as a child reports
learner.take()
never = lambda: False
learner.learn((), never)  # starts the trial
assert learner.trial_fd is not None
while not learner.trial_read():
    select.select([learner.trial_fd], [], [], max(0.0, learner.deadline() - time.monotonic()))
learner.learn((), never)  # imports what the trial could
print(json.dumps({name: name in sys.modules for name in sys.argv[2:]}), flush=True)
"""


def test_a_library_that_starts_a_thread_fails_or_hangs_is_not_preloaded(
        tmp_path: Path) -> None:
    """The launcher forks: a library that starts a thread when imported (a fork keeps only
    the forking thread, and any lock the other held stays held), or whose import fails or
    takes longer than the trial's time, is not imported in it; the others are."""
    (tmp_path / "starts_a_thread.py").write_text(textwrap.dedent("""
        import threading
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    """))
    (tmp_path / "fails.py").write_text("raise ImportError('not here')\n")
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    for names, expected in (
            (["colorsys", "starts_a_thread"], {"colorsys": False, "starts_a_thread": False}),
            (["colorsys", "fails"], {"colorsys": True, "fails": False}),
            (["colorsys", "hangs"], {"colorsys": False, "hangs": False})):
        proc = subprocess.run([sys.executable, "-c", LEARNER, str(tmp_path), *names],
                              capture_output=True, text=True, timeout=60, check=False,
                              cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == expected, names
