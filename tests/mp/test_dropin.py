"""A multiprocessing program runs unchanged but for its import."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_program_output_matches_the_stdlib() -> None:
    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tests.mp.dropin_program", *args],
                              capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == run("stdlib")
    assert "[0, 1, 4, 9, 16]" in run()
