"""`run_script`: a behaviour test's program run as a user runs it, ``python script.py``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def run_script(tmp_path: Path, text: str, *args: str, options: Sequence[str] = (),
               timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Write ``text`` to ``script.py`` in ``tmp_path`` and run it there with ``args`` (after
    the interpreter's ``options``); it must exit with 0."""
    script = tmp_path / "script.py"
    script.write_text(text)
    done = subprocess.run([sys.executable, *options, str(script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done
