"""``fiberexec top`` against real executors with ``observe=True``, and its endpoint's file."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fiberexec import _cli_top
from fiberexec.observe import ExecutorEntry, list_executors, snapshot
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.test_observe import held


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory of this test's own: other executors on the machine stay out."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "fiberexec"


def top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fiberexec", "top", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_top_once_shows_the_workers_and_the_running_task(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    ex = make_executor(1, observe=True)
    with held() as (args, started, release):
        future = ex.submit(tasks.hold_until, *args)
        assert started.poll(30), "the task did not start"
        (record,) = runtime.glob("*.json")
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
        shown = top("--once")
        assert shown.returncode == 0, shown.stderr
        (worker,) = ex.workers()
        line = next(x for x in shown.stdout.splitlines() if x.startswith(worker.worker_id))
        assert "running" in line and "tests.tasks.hold_until(" in line
        assert f"executor {ex.executor_id}" in shown.stdout  # type: ignore[union-attr]
        release.send(None)
        future.result(timeout=30)
    ex.shutdown()
    assert not record.exists()
    gone = top("--once")
    assert gone.returncode == 1 and "no executor with observe=True" in gone.stderr


def test_top_sees_an_executor_whose_shutdown_waits_for_a_straggler(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    """The end of a run held up by one task is when a researcher looks: the executor is
    there until its shutdown has ended (it said no executor was running)."""
    ex = make_executor(1, observe=True)
    with held() as (args, started, release):
        future = ex.submit(tasks.hold_until, *args)
        assert started.poll(30), "the task did not start"
        closing = threading.Thread(target=ex.shutdown)
        closing.start()
        shown = top("--once")
        assert shown.returncode == 0, shown.stderr
        assert "tests.tasks.hold_until(" in shown.stdout
        release.send(None)
        future.result(timeout=30)
        closing.join(timeout=60)
    assert not closing.is_alive() and not list(runtime.glob("*.json"))


def test_several_executors_are_listed_and_one_is_picked_by_id(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    first, second = make_executor(1, observe=True), make_executor(1, observe=True)
    for ex in (first, second):
        ex.submit(tasks.square, 2).result(timeout=60)
    ids = [ex.executor_id for ex in (first, second)]  # type: ignore[union-attr]
    both = top("--once")
    assert both.returncode == 2 and all(i in both.stderr for i in ids), both.stderr
    picked = top("--once", "--executor", ids[1])
    assert picked.returncode == 0 and f"executor {ids[1]}" in picked.stdout
    start = next(ids[1][:n] for n in range(1, 9) if not ids[0].startswith(ids[1][:n]))
    by_start = top("--once", "--executor", start)  # as docs/cli.md shows it: 3f2a
    assert by_start.returncode == 0 and f"executor {ids[1]}" in by_start.stdout
    unknown = top("--once", "--executor", "nope")
    assert unknown.returncode == 2 and "no executor 'nope'" in unknown.stderr


def test_stale_files_are_ignored_and_a_wrong_token_is_refused(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    ex = make_executor(1, observe=True)
    ex.submit(tasks.square, 2).result(timeout=60)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)
    stale = runtime / f"{dead.stdout.strip()}-deadbeef.json"
    stale.write_text(json.dumps({"executor_id": "deadbeef", "pid": int(dead.stdout),
                                 "host": "127.0.0.1", "port": 1, "token": "x", "started": 0}))
    (entry,) = list_executors()
    assert entry.pid == os.getpid() and not stale.exists()
    assert [w["state"] for w in snapshot(entry)["workers"]] == ["idle"]
    with pytest.raises(ConnectionError, match="refused: wrong token"):
        snapshot(dataclasses.replace(entry, token="0" * 32))


def test_a_task_over_three_times_its_median_is_a_straggler() -> None:
    def worker(wid: str, started: float) -> dict[str, object]:
        return {"worker_id": wid, "host": "h", "state": "running", "tasks_done": 1,
                "tasks_failed": 0, "cpu_percent": 99.0, "rss_bytes": 1 << 30,
                "task": {"task_id": 1, "function": "m.f", "arguments": "1",
                         "started": started}}

    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 2, "throughput": 2.0, "medians": {"m.f": 1.0},
            "stats": {"tasks_pending": 0, "tasks_running": 2, "tasks_done": 9,
                      "tasks_failed": 1, "tasks_retried": 0},
            "workers": [worker("w0", 99.0), worker("w1", 95.0)],
            "failures": [{"task_id": 3, "worker_id": "w0", "function": "m.f",
                          "arguments": "0", "error": "ValueError: no"}]}
    lines = _cli_top.render(view, color=True).splitlines()
    slow = next(x for x in lines if "w1" in x)
    fast = next(x for x in lines if "w0" in x and "m.f(1)" in x)
    assert "5.0s !" in slow and slow.startswith("\x1b[1;31m")
    assert "!" not in fast and "\x1b" not in fast
    assert lines.index(slow) < lines.index(fast)  # the longest running first
    assert "1.0G" in slow and "task 3 on w0: m.f(0): ValueError: no" in lines[-1]


def test_a_gone_worker_shows_how_it_ended_where_its_task_was() -> None:
    gone = {"worker_id": "w3", "host": "h", "state": "lost", "tasks_done": 4,
            "tasks_failed": 0, "cpu_percent": None, "rss_bytes": None, "task": None,
            "ended": "was killed by signal 9 (SIGKILL)"}
    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 1, "throughput": 1.0, "medians": {},
            "stats": {"tasks_pending": 0, "tasks_running": 0, "tasks_done": 4,
                      "tasks_failed": 0, "tasks_retried": 0},
            "workers": [gone], "failures": []}
    (line,) = [x for x in _cli_top.render(view).splitlines() if x.startswith("w3")]
    assert line.split()[2] == "lost" and line.endswith("was killed by signal 9 (SIGKILL)")


def test_the_failures_head_says_how_many_are_shown_of_how_many() -> None:
    failures = [{"task_id": i, "worker_id": "w0", "function": "m.f", "arguments": str(i),
                 "error": "ValueError: no"} for i in range(10)]
    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 1, "throughput": 1.0, "medians": {},
            "stats": {"tasks_pending": 0, "tasks_running": 0, "tasks_done": 0,
                      "tasks_failed": 13, "tasks_retried": 0},
            "workers": [], "failures": failures}
    lines = _cli_top.render(view).splitlines()
    head = lines.index("last failures (5 of 13 failed):")
    shown = [x.split(":")[0] for x in lines[head + 1:]]
    assert shown == [f"  task {i} on w0" for i in range(5, 10)]


def test_a_task_of_a_function_with_no_finished_run_is_judged_by_every_tasks_median() -> None:
    """One odd function in a run of short tasks (or the first of a kind): it has no median
    of its own, and 8 s against tasks of a quarter of a second is a straggler all the same."""
    def worker(wid: str, function: str) -> dict[str, object]:
        return {"worker_id": wid, "host": "h", "state": "running", "tasks_done": 1,
                "tasks_failed": 0, "cpu_percent": 1.0, "rss_bytes": 1 << 20,
                "task": {"task_id": 1, "function": function, "arguments": "",
                         "started": 92.0}}

    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 2, "throughput": 2.0, "medians": {"m.evaluate": 0.25, "*": 0.25},
            "stats": {"tasks_pending": 0, "tasks_running": 2, "tasks_done": 9,
                      "tasks_failed": 0, "tasks_retried": 0},
            "workers": [worker("w0", "m.straggler")], "failures": []}
    (line,) = [x for x in _cli_top.render(view).splitlines() if x.startswith("w0")]
    assert "8.0s !" in line
    view["medians"] = {}  # nothing finished at all: nothing to judge by
    (line,) = [x for x in _cli_top.render(view).splitlines() if x.startswith("w0")]
    assert "!" not in line


def test_a_task_under_a_second_is_no_straggler_however_quick_its_function() -> None:
    """The dashboard's rule: over 3 times the median and over a second. A 0.5 s task of a
    function whose tasks take 2 ms (a chunk of a map, say) is not flagged."""
    task = {"task_id": 1, "function": "m.f", "arguments": "1", "started": 99.5}
    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 1, "throughput": 1.0, "medians": {"m.f": 0.002},
            "stats": {"tasks_pending": 0, "tasks_running": 1, "tasks_done": 50,
                      "tasks_failed": 0, "tasks_retried": 0},
            "workers": [{"worker_id": "w0", "host": "h", "state": "running",
                         "tasks_done": 50, "tasks_failed": 0, "cpu_percent": 99.0,
                         "rss_bytes": 1 << 20, "task": task}],
            "failures": []}
    (line,) = [x for x in _cli_top.render(view, color=True).splitlines() if "w0" in x]
    assert "0.5s" in line and "!" not in line and "\x1b[1;31m" not in line


def test_lines_are_whole_in_a_file_and_cut_with_an_ellipsis_on_a_screen() -> None:
    """A frame written to a file or pipe keeps every line whole (the seed at the end of a
    task's arguments is what tells two apart); a screen cuts each to its width, and says so,
    as a column too narrow for its cell does."""
    task = {"task_id": 1, "function": "es.evaluate", "started": 99.0,
            "arguments": "array([" + "1., " * 40 + "1.]), seed=1234"}
    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 1, "throughput": 1.0, "medians": {},
            "stats": {"tasks_pending": 0, "tasks_running": 1, "tasks_done": 0,
                      "tasks_failed": 0, "tasks_retried": 0},
            "workers": [{"worker_id": "w0", "host": "a-very-long-host-name.example",
                         "state": "running", "tasks_done": 0, "tasks_failed": 0,
                         "cpu_percent": 99.0, "rss_bytes": 1 << 20, "task": task}],
            "failures": []}
    whole = _cli_top._frame(view, terminal=False)
    (line,) = [x for x in whole.splitlines() if x.startswith("w0")]
    assert line.endswith("seed=1234)") and "a-very-long-h\u2026" in line  # a cell: marked
    screen = _cli_top.render(view, width=80)
    (cut,) = [x for x in screen.splitlines() if x.startswith("w0")]
    assert len(cut) == 80 and cut.endswith("\u2026") and "a-very-long-h\u2026" in cut


def test_an_80_column_screen_shows_the_task_a_worker_runs() -> None:
    """The columns are as wide as what they show (within bounds): short ids and a short
    host leave the task its call on a terminal of 80 columns."""
    def worker(wid: str, arguments: str) -> dict[str, object]:
        return {"worker_id": wid, "host": "vm", "state": "running", "tasks_done": 12,
                "tasks_failed": 0, "cpu_percent": 99.0, "rss_bytes": 21 << 20,
                "task": {"task_id": 1, "function": "__main__.work", "arguments": arguments,
                         "started": 96.1}}

    view = {"time": 100.0, "executor_id": "e", "pid": 1, "backend": "local",
            "max_workers": 2, "throughput": 2.0, "medians": {},
            "stats": {"tasks_pending": 0, "tasks_running": 2, "tasks_done": 24,
                      "tasks_failed": 0, "tasks_retried": 0},
            "workers": [worker("w0", "20"), worker("w1", "seed=" + "7" * 60)],
            "failures": []}
    lines = _cli_top.render(view, width=80).splitlines()
    heading = next(x for x in lines if x.startswith("WORKER"))
    (short,) = [x for x in lines if x.startswith("w0")]
    (long_,) = [x for x in lines if x.startswith("w1")]
    assert short.endswith("__main__.work(20)") and short.split()[:3] == ["w0", "vm", "running"]
    assert len(long_) == 80 and long_.endswith("\u2026") and "__main__.work(seed=777" in long_
    assert short.index("__main__") == heading.index("TASK") and 80 - heading.index("TASK") >= 28


def _entry(executor_id: str, pid: int) -> ExecutorEntry:
    return ExecutorEntry(executor_id, pid, "127.0.0.1", 1, "t", 0.0, "python x.py", "local",
                         Path("/nonexistent"))


def test_a_start_of_several_ids_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    entries = [_entry("3f2a01bc", 101), _entry("3f2a77de", 102), _entry("9c00aa11", 103)]
    assert _cli_top._choose(entries, "3f2a") is None
    error = capsys.readouterr().err
    assert error.startswith("fiberexec top: --executor '3f2a' names 2 executors (their "
                            "process, or the start of their ids); give more of an id:\n")
    assert "3f2a01bc" in error and "3f2a77de" in error and "9c00aa11" not in error
    assert _cli_top._choose(entries, "3f2a7") == entries[1]
    assert _cli_top._choose(entries, "103") == entries[2]  # a pid


class _Frames(io.StringIO):
    """stdout redirected to a file: not a terminal; says when the first frame is out."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()

    def flush(self) -> None:
        super().flush()
        self.first.set()


def test_to_a_file_top_writes_plain_frames(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    ex = make_executor(1, observe=True)
    ex.submit(tasks.square, 2).result(timeout=60)
    out = _Frames()
    watching = threading.Thread(target=_cli_top.run, args=(None,),
                                kwargs={"once": False, "interval": 0.05, "out": out})
    watching.start()
    assert out.first.wait(30), "top wrote no frame"
    ex.shutdown(wait=True)
    watching.join(30)
    text = out.getvalue()
    assert not watching.is_alive() and "\x1b" not in text  # no screen control, no colour
    assert text.startswith("fiberexec top - executor ")
    assert text.rstrip().endswith("has ended")


def test_a_client_that_dawdles_holds_up_no_other(
        make_executor: ExecutorFactory, runtime: Path) -> None:
    """Each client has its own thread and `IO_TIMEOUT` in all to ask."""
    import socket
    import time

    ex = make_executor(1, observe=True)
    ex.submit(tasks.square, 2).result(timeout=60)
    (entry,) = list_executors()
    stop = threading.Event()

    def dawdle() -> None:  # a byte at a time, each before the last one's timeout ran out
        with (socket.create_connection((entry.host, entry.port), timeout=10) as conn,
              contextlib.suppress(OSError)):  # until the server cuts it off
            while not stop.wait(0.5):
                conn.send(b" ")

    dawdler = threading.Thread(target=dawdle)
    dawdler.start()
    try:
        time.sleep(0.2)  # the dawdler is connected first
        assert snapshot(entry, timeout=3)["executor_id"] == entry.executor_id
    finally:
        stop.set()
        dawdler.join(10)


STOPPED = """
import sys
from fiberexec import FiberExecutor
from tests import tasks

with FiberExecutor(1, observe=True) as ex:
    ex.submit(tasks.square, 2).result(timeout=60)
    print("ready", flush=True)
    sys.stdin.read()
"""


def test_top_says_an_executor_that_does_not_answer_is_alive(runtime: Path) -> None:
    """A stopped executor is not an ended one: one line, exit 3, no traceback."""
    import signal

    with subprocess.Popen([sys.executable, "-c", STOPPED], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parent.parent) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline() == "ready\n"
            os.kill(proc.pid, signal.SIGSTOP)
            shown = top("--once")
            assert shown.returncode == 3, shown.stderr
            assert "Traceback" not in shown.stderr
            assert f"(pid {proc.pid}) did not answer" in shown.stderr
            assert "its process is alive: stopped, or too busy" in shown.stderr
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.close()
            proc.wait(60)
    assert proc.returncode == 0


def test_top_refuses_an_interval_that_is_not_a_sane_number_of_seconds() -> None:
    for interval in ("nan", "0", "1e300", "-1"):
        shown = top("--interval", interval)
        assert shown.returncode == 2 and "--interval must be a number of seconds" in shown.stderr
