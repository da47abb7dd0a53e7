"""Task output forwarding with real local workers: prefixes, order, files, off, validation."""

from __future__ import annotations

import re
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fiberexec import ConfigurationError, FiberExecutor, WorkerLostError
from fiberexec._capture import LONG_LINE, PROMPT_BURST, Capture
from tests import tasks
from tests.conftest import ExecutorFactory

ROOT = Path(__file__).resolve().parent.parent


def test_forwarded_lines_carry_worker_and_host_and_keep_their_order(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str]) -> None:
    ex = make_executor(1, output="forward")
    assert ex.submit(tasks.chatter, 2000, "done").result(timeout=60) == "done"
    (worker,) = ex.workers()
    ex.shutdown()  # the writer thread has written everything once this returns
    out, err = capfd.readouterr()
    prefix = f"[{worker.worker_id} {socket.gethostname()}] "
    mine = [line for line in out.splitlines() if line.startswith(prefix)]
    assert mine == [f"{prefix}line {i}" for i in range(2000)]
    assert f"{prefix}to stderr" in err.splitlines()


@pytest.mark.parametrize("lines", [1, 500])
def test_what_a_task_printed_is_written_before_the_program_has_its_result(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str],
        lines: int) -> None:
    """The program's own line about a result comes after the task's lines, as when the
    worker writes to the terminal itself (a few lines, and more than a few KiB)."""
    ex = make_executor(2, output="forward")
    for i in range(10):
        print(f"result {ex.submit(tasks.chatter, lines, i).result(timeout=60)}", flush=True)
    ex.shutdown()
    out, _ = capfd.readouterr()
    order = [line.split("] ")[-1] for line in out.splitlines()]
    assert [line for line in order if line.startswith(("line", "result"))] == [
        line for i in range(10) for line in (*(f"line {j}" for j in range(lines)),
                                             f"result {i}")]


STALLED_READER = """
import sys
from fiberexec import FiberExecutor
from tests import tasks

with FiberExecutor(3, output="forward", heartbeat=0.5, silence_timeout=3) as ex:
    ex.submit(tasks.chatter, 20000, "burst").result(timeout=60)  # ~200 KB: > a pipe holds
    for _ in range(3):  # longer than the workers' silence_timeout
        assert list(ex.map(tasks.sleep_return, [0.5] * 6, range(6))) == list(range(6))
    print("mapped", ex.stats().workers_lost, ex.stats().tasks_retried, file=sys.stderr,
          flush=True)
"""


def test_a_reader_that_stops_reading_holds_up_only_the_output(tmp_path: Path) -> None:
    """With the program's stdout a pipe nobody reads (``| less`` left unscrolled), tasks
    are still dispatched and their results come: the forwarded lines wait (the stdlib's
    workers would block in their own writes; here the executor's writer thread does), and
    no worker hears so little that it leaves."""
    child = subprocess.Popen([sys.executable, "-c", STALLED_READER], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stderr is not None and child.stdout is not None
        # stdout unread until then; the maps take ~1.5 s
        ready, _, _ = select.select([child.stderr], [], [], 90)
        assert ready, "the tasks did not finish while the program's stdout was not read"
        said = child.stderr.readline()
        assert said.split() == [b"mapped", b"0", b"0"], said + child.stderr.read()
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.wait(60)
    assert child.returncode == 0, err
    assert out.count(b"] line ") == 20000


LAST_WORDS = """
import sys
from concurrent.futures import ProcessPoolExecutor
from fiberexec import FiberExecutor
from tests import tasks

system, how = sys.argv[1:]
ex = (ProcessPoolExecutor(1) if system == "stdlib" else
      FiberExecutor(1, output="forward", max_task_retries=0))
with ex:
    try:
        ex.submit(tasks.say_then_die, system, how).result(timeout=60)
    except Exception as exc:
        print("raised", type(exc).__name__, flush=True)
"""


@pytest.mark.parametrize("how", ["exit", "segfault"])
@pytest.mark.parametrize("system", ["stdlib", "fiberexec"])
def test_lines_a_task_flushed_before_crashing_its_worker_arrive(system: str, how: str) -> None:
    """A flushed line is not held back in the worker: the task's last words survive it."""
    done = subprocess.run([sys.executable, "-c", LAST_WORDS, system, how], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    out = [line.split("] ")[-1] for line in done.stdout.splitlines()]
    assert out == [f"{system}: last words",
                   f"raised {'BrokenProcessPool' if system == 'stdlib' else 'WorkerLostError'}"]
    assert f"{system}: on stderr" in [line.split("] ")[-1] for line in done.stderr.splitlines()]
    if system == "fiberexec" and how == "segfault":  # where it crashed, as loky's workers say
        # The worker writes the report itself, a piece at a time, and the executor's writes
        # of forwarded lines (one write a line) may land between two pieces: without them,
        # the report reads whole
        report = re.sub(r"\[w\d+ [^\]\n]+\] [^\n]*\n", "", done.stderr)
        for part in ("Fatal Python error: Segmentation fault", " in say_then_die\n"):
            assert part in report, done.stderr


def test_last_words_after_a_burst_of_log_lines_arrive(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str]) -> None:
    """A task that logged a few dozen lines, then crashed its worker: every line arrives,
    as from a stdlib worker (each flushed line goes at once while the budget lasts)."""
    ex = make_executor(1, output="forward", max_task_retries=0)
    with pytest.raises(WorkerLostError, match="code 3"):
        ex.submit(tasks.log_then_die, 60).result(timeout=60)
    ex.shutdown()
    out, err = capfd.readouterr()
    assert [line.split("] ")[-1] for line in err.splitlines() if "] step " in line] == [
        f"step {i}" for i in range(60)]
    assert any(line.endswith("] last words") for line in out.splitlines()), out


@pytest.mark.parametrize("into", ["forward", "directory"])
def test_a_line_a_task_leaves_unfinished_arrives_with_the_task(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str],
        tmp_path: Path, into: str) -> None:
    """Even as the last words before a shutdown, which closes the workers' links at once."""
    output = "forward" if into == "forward" else str(tmp_path / "out") + "/"
    ex = make_executor(1, output=output)
    assert ex.submit(tasks.say_unfinished, "first").result(timeout=60) == "first"
    ex.submit(tasks.say_unfinished, "last").result(timeout=60)
    (worker,) = ex.workers()
    ex.shutdown()
    if into == "forward":
        out = capfd.readouterr().out.splitlines()
        prefix = f"[{worker.worker_id} {socket.gethostname()}] "
        assert [line for line in out if line.startswith(prefix)] == [
            f"{prefix}first", f"{prefix}last"]
    else:
        assert (tmp_path / "out" / f"{worker.worker_id}.out").read_text() == "first\nlast\n"


def test_a_byte_decoded_with_surrogateescape_goes_out_as_that_byte(
        make_executor: ExecutorFactory, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """A file name or binary junk a task decoded with ``surrogateescape`` prints as its
    bytes, as to a terminal of a stdlib worker; what no encoding can write, escaped (the
    task does not fail for printing it)."""
    ex = make_executor(1, output="forward")
    assert ex.submit(print, "name \udcff\udcfe, lone \ud800").result(timeout=60) is None
    (worker,) = ex.workers()
    ex.shutdown()
    prefix = f"[{worker.worker_id} {socket.gethostname()}] ".encode()
    assert prefix + b"name \xff\xfe, lone \\ud800" in capfdbinary.readouterr().out.splitlines()


def test_local_workers_inherit_output_by_default(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str]) -> None:
    ex = make_executor(1)
    ex.submit(tasks.chatter, 1).result(timeout=60)
    ex.shutdown()
    out, _ = capfd.readouterr()
    assert "line 0" in out.splitlines()  # as the worker wrote it, no prefix


def test_output_off_discards_and_a_directory_gets_a_file_per_worker_and_stream(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    off = make_executor(1, output="off")
    off.submit(tasks.chatter, 3).result(timeout=60)
    off.shutdown()
    assert "line" not in "".join(capfd.readouterr())
    into = tmp_path / "out"
    ex = make_executor(1, output=str(into) + "/")
    ex.submit(tasks.chatter, 3).result(timeout=60)
    (worker,) = ex.workers()
    ex.shutdown()
    assert (into / f"{worker.worker_id}.out").read_text() == "line 0\nline 1\nline 2\n"
    assert (into / f"{worker.worker_id}.err").read_text() == "to stderr\n"


def test_a_bad_output_setting_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="output must be one of 'forward'.*got 'froward'"):
        FiberExecutor(1, output="froward")
    monkeypatch.setenv("FIBEREXEC_OUTPUT", "off")
    assert FiberExecutor(1)._config.output == "off"


def test_capture_holds_whole_lines_and_sends_when_full() -> None:
    sent: list[tuple[bytes, bytes]] = []
    woken: list[int] = []
    capture = Capture(send=lambda: sent.append(capture.take()), wake=lambda: woken.append(1))
    capture.write(1, b"par")
    assert capture.size == 0 and not sent and not woken
    capture.write(1, b"tial\nnext")  # a flush bringing a whole line: sent at once
    capture.write(2, b"e\n")
    assert sent == [(b"partial\n", b""), (b"", b"e\n")]
    assert capture.take(everything=True) == (b"next\n", b"")
    for _ in range(PROMPT_BURST):  # the prompt budget runs out...
        capture.write(1, b"x\n")
    assert len(sent) == PROMPT_BURST and woken == [1]  # ...then lines wait for the outbox
    assert capture.take() == (b"x\nx\n", b"")
    capture.write(1, b"x" * (300 << 10) + b"\n")
    assert len(sent) == PROMPT_BURST + 1  # full: sent whatever the budget


def test_capture_keeps_a_long_line_whole_and_cuts_only_past_the_limit() -> None:
    capture = Capture(send=lambda: None, wake=lambda: None)
    for _ in range(3):  # a line written in pieces, each flushed
        capture.write(1, b"A" * 40_000)
    capture.write(1, b"\n")
    assert capture.take() == (b"A" * 120_000 + b"\n", b"")
    capture.write(1, b"L" * (LONG_LINE + 1))  # past the limit: it goes in pieces...
    capture.write(1, b"\n")  # ...and its own end adds no empty line
    capture.write(1, b"after\n")
    assert capture.take() == (b"L" * (LONG_LINE + 1) + b"\nafter\n", b"")


def test_capture_prefixes_every_line_when_asked() -> None:
    capture = Capture(send=lambda: None, wake=lambda: None, prefix=b"[w1 h] ")
    capture.write(1, b"a\nb\n")
    capture.write(2, b"c\n")
    assert capture.take() == (b"[w1 h] a\n[w1 h] b\n", b"[w1 h] c\n")


def test_an_output_directory_that_cannot_be_made_is_an_error_not_a_loss(
        make_executor: ExecutorFactory, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    ex = make_executor(1, output=str(tmp_path / "afile" / "out") + "/")
    with pytest.raises(ConfigurationError, match=r"the tasks' output cannot go there \("):
        ex.submit(tasks.square, 2)
