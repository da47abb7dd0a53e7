"""Task output forwarding with real local workers: prefixes, order, files, off, validation."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fiberexec import ConfigurationError, FiberExecutor
from fiberexec._capture import Capture
from tests import tasks
from tests.conftest import ExecutorFactory


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


def test_what_a_task_printed_is_written_before_the_program_has_its_result(
        make_executor: ExecutorFactory, capfd: pytest.CaptureFixture[str]) -> None:
    """The program's own line about a result comes after the task's lines, as when the
    worker writes to the terminal itself."""
    ex = make_executor(2, output="forward")
    for i in range(30):
        print(f"result {ex.submit(tasks.chatter, 1, i).result(timeout=60)}", flush=True)
    ex.shutdown()
    out, _ = capfd.readouterr()
    order = [line.split("] ")[-1] for line in out.splitlines()]
    assert [line for line in order if line.startswith(("line", "result"))] == [
        line for i in range(30) for line in ("line 0", f"result {i}")]


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
    sent: list[int] = []
    woken: list[int] = []
    capture = Capture(send=lambda: sent.append(1), wake=lambda: woken.append(1))
    capture.write(1, b"par")
    assert capture.size == 0 and not woken
    capture.write(1, b"tial\nnext")
    capture.write(2, b"e\n")
    assert len(woken) == 1 and capture.take() == (b"partial\n", b"e\n")
    assert capture.take(everything=True) == (b"next\n", b"")
    capture.write(1, b"x" * (300 << 10) + b"\n")
    assert sent == [1]


def test_capture_prefixes_every_line_when_asked() -> None:
    capture = Capture(send=lambda: None, wake=lambda: None, prefix=b"[w1 h] ")
    capture.write(1, b"a\nb\n")
    capture.write(2, b"c\n")
    assert capture.take() == (b"[w1 h] a\n[w1 h] b\n", b"[w1 h] c\n")
