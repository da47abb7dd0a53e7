"""A `Pool` left open when the program ends is stopped, as the stdlib's is, not awaited.

The stdlib's pool workers are daemons, terminated at interpreter exit; a script that ends
(or is interrupted) with work queued stops at once. Run as a script over both.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

SCRIPT = '''
import os, sys, time

if sys.argv[1] == "stdlib":
    import multiprocessing as mp
else:
    import fiberexec.multiprocessing as mp


def slow(path):
    open(path, "w").close()
    time.sleep(0.3)


if __name__ == "__main__":
    folder = sys.argv[2]
    pool = mp.Pool(2)
    pool.map_async(slow, [os.path.join(folder, str(i)) for i in range(40)])  # 6 s of work
    while not os.listdir(folder):
        time.sleep(0.01)
    if sys.argv[3] == "interrupt":
        raise KeyboardInterrupt  # as Ctrl-C during the program would
    print("leaving", flush=True)
'''


@pytest.mark.parametrize("how", ["end", "interrupt"])
@pytest.mark.parametrize("kind", ["stdlib", "fiberexec"])
def test_a_pool_left_open_at_exit_is_stopped_not_awaited(
        kind: str, how: str, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    folder = tmp_path / "ran"
    folder.mkdir()
    run = subprocess.run([sys.executable, str(script), kind, str(folder), how],
                         check=False, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    if how == "end":
        assert run.returncode == 0, run.stderr
    else:  # the interpreter ends itself with SIGINT, as for an uncaught Ctrl-C
        assert run.returncode == -2 and "KeyboardInterrupt" in run.stderr, run.stderr
    ran = len(list(folder.iterdir()))
    assert ran < 20, f"{ran} of 40 tasks ran after the program ended"
