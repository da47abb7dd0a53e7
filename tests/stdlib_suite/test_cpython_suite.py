"""CPython's own multiprocessing suite on fiberexec (`cpython_processes`, `cpython_manager`),
each part in a fresh interpreter: the suite changes process-wide state as it goes (start
method, signal handlers, the stdlib's temporary directory, its resource tracker), so it
runs alone, as CPython runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# Ctrl-C raises KeyboardInterrupt in the suite's interpreter even where CI starts us with
# SIGINT ignored (a background job), as some of its tests count on
_RUN = ("import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.exit(pytest.main(sys.argv[1:]))")
# on CPython 3.11; each suite's module lists what does not pass, and why
PASSING = {"cpython_processes.py": 136, "cpython_manager.py": 65}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("suite", sorted(PASSING))
def test_cpython_multiprocessing_suite_on_fiberexec(suite: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(Path(__file__).with_name(suite)), "-q", "-rfEX",
         "--timeout=120"],
        cwd=ROOT, capture_output=True, text=True, timeout=850, check=False,
    )
    report = done.stdout[-8000:] + done.stderr[-4000:]
    assert done.returncode == 0, report
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) >= PASSING[suite], report
