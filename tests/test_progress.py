"""The tqdm progress bar (the ``progress`` extra) and `enable_logging`."""

from __future__ import annotations

import io
import logging
from concurrent.futures import as_completed

import pytest

from fiberexec import FiberExecutor, Stats
from fiberexec._logging import enable_logging
from fiberexec._progress import progress_bar
from fiberexec.backends.local import LocalBackend

pytest.importorskip("tqdm")


def _stats(done: int, pending: int, running: int, failed: int = 0) -> Stats:
    return Stats(2, 0, pending, running, done, failed, 1, 0, 0, 0, 10.0)


def test_bar_follows_stats_as_the_progress_hook() -> None:
    out = io.StringIO()
    with progress_bar(file=out, mininterval=0) as bar:
        bar(_stats(done=3, pending=5, running=2))
        assert (bar.n, bar.bar.total) == (3, 10)
        bar(_stats(done=9, pending=0, running=0, failed=1))
        assert (bar.n, bar.bar.total) == (10, 10)
    assert "retried=1" in out.getvalue() and "workers=2" in out.getvalue()


def test_bar_on_a_real_executor_and_as_completed() -> None:
    out = io.StringIO()
    with progress_bar(file=out, total=50) as hook, \
            FiberExecutor(2, backend=LocalBackend(), progress=hook) as ex:
        futures = [ex.submit(abs, -i) for i in range(50)]
        total = sum(f.result() for f in progress_bar(as_completed(futures), total=50, file=out))
    assert total == sum(range(50))
    assert hook.n == 50
    assert "50/50" in out.getvalue()


def test_iterating_a_hook_only_bar_is_an_error() -> None:
    with progress_bar(file=io.StringIO()) as bar, pytest.raises(TypeError, match="iterable"):
        iter(bar)


def test_enable_logging_adds_one_handler() -> None:
    logger = logging.getLogger("fiberexec")
    before, level = list(logger.handlers), logger.level
    stream = io.StringIO()
    try:
        enable_logging("DEBUG", stream=stream)
        enable_logging(logging.INFO, stream=stream)
        assert len(logger.handlers) == len(before) + 1 and logger.level == logging.INFO
        logger.info("worker w0 connected")
        assert "fiberexec INFO worker w0 connected" in stream.getvalue()
        with pytest.raises(ValueError, match="level must be a logging level"):
            enable_logging("LOUD")
    finally:
        for handler in set(logger.handlers) - set(before):
            logger.removeHandler(handler)
        logger.setLevel(level)
