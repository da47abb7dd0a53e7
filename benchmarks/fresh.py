"""Run one measurement in a fresh process and leave nothing of it behind.

`run` starts ``python -m MODULE ARGS`` in a new session with a hard timeout, reads its
``BENCH-RESULT {json}`` line, and then ends every process the measurement left: its process
group, its descendants, and any process still carrying the run's token in its environment.
The token is needed because some workers leave the group on purpose (fiberexec's local
workers start their own sessions) and orphans are no longer descendants once their parent
is gone. Every process matched is one this run started, and each is killed by its pid.
"""

from __future__ import annotations

import compileall
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from benchmarks.measure import MARKER

ROOT = Path(__file__).resolve().parents[1]
TOKEN_VAR = "BENCH_MEASUREMENT_TOKEN"
#: One thread per numpy process, so the workers never fight over BLAS threads.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Metrics = dict[str, Any]


def run(module: str, args: list[str], timeout: float) -> Metrics:
    """The metrics ``python -m module *args`` printed, or ``{"error": ...}``."""
    compile_once()
    token = uuid.uuid4().hex
    env = {**os.environ, **SINGLE_THREADED, TOKEN_VAR: token,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = clean_up(proc, token)
        return {"error": f"timed out after {timeout:.0f}s", "processes_killed": killed}
    left = clean_up(proc, token)
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            metrics: Metrics = json.loads(line[len(MARKER):])
            if "error" in metrics:
                print(f"    {module} {' '.join(args)}: {metrics['error']}\n{err[-2000:]}",
                      file=sys.stderr)
            if left:
                metrics["processes_left"] = left
            return metrics
    return {"error": f"exit code {proc.returncode}: {err.strip()[-300:]}"}


@functools.cache
def compile_once() -> None:
    """Compile fiberexec and the benchmarks to bytecode, as ``pip install`` does: measured
    from a source tree under ``PYTHONDONTWRITEBYTECODE``, every fresh worker would compile
    each module it imports, where the standard library's are compiled already."""
    for folder in ("fiberexec", "backends", "benchmarks"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def clean_up(proc: subprocess.Popen[str], token: str) -> int:
    """Kill what is left of the measurement ``proc`` ran; how many processes that was.

    While ``proc`` is not reaped its pid cannot be reused, so its process group and its
    descendants are safe to kill. Once it is reaped only the token identifies its processes.
    """
    import psutil

    victims: dict[int, psutil.Process] = {}
    if proc.returncode is None:  # not reaped: the pid and group id are still this run's
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                victims[child.pid] = child
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for candidate in psutil.process_iter():
        if candidate.pid in victims or candidate.pid in (os.getpid(), proc.pid):
            continue
        with contextlib.suppress(psutil.Error):
            if candidate.environ().get(TOKEN_VAR) == token:
                victims[candidate.pid] = candidate
    for victim in victims.values():
        with contextlib.suppress(psutil.Error):
            victim.kill()
    psutil.wait_procs(list(victims.values()), timeout=30)
    if proc.returncode is None:
        proc.kill()
        proc.communicate(timeout=30)
    return len(victims)
