"""What a script's own code costs to move: run as the program (``python -m``), so that its
functions and classes are ``__main__``'s, which fiberexec sends by value and the standard
library's forked workers simply have.

* ``rollouts``: tasks return lists of a script dataclass (RL trajectories): 3 of 300,000
  steps, then a map of 2000 of 200 steps.
* ``table``: a script function reads a 200,000-entry dict global (a lookup table): a map of
  200 tasks, then 200 tasks submitted one by one.

Each system runs in a fresh process, the systems alternating, each going first in turn::

    python -m benchmarks.script_data --repeat 3

Prints a markdown table (fiberexec's time over the stdlib's ``ProcessPoolExecutor(2)``)
and writes ``benchmarks/script_data.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ("stdlib", "fiberexec")
TIMEOUT = 300.0
ROWS = {
    "rollouts_large": "3 results of 300,000 dataclass steps, s",
    "rollouts_small": "map of 2000 results of 200 dataclass steps, s",
    "table_map": "map of 200 tasks reading a 200,000-entry dict global, s",
    "table_submits": "200 submits of a task reading that dict, s",
}
TABLE = {i: float(i) for i in range(200_000)}


@dataclass
class Step:
    obs: float
    reward: float
    done: bool


def rollout(n: int) -> list[Step]:
    return [Step(float(i), 1.0, False) for i in range(n)]


def look(i: int) -> float:
    return TABLE[i * 7]


def measure(system: str) -> dict[str, float]:
    """One system's rows, in this process."""
    if system == "fiberexec":
        from fiberexec import FiberExecutor, PerformanceWarning

        warnings.simplefilter("ignore", PerformanceWarning)  # (it says the table is large)
        ex: Any = FiberExecutor(2)
    else:
        from concurrent.futures import ProcessPoolExecutor

        ex = ProcessPoolExecutor(2)
    with ex:
        ex.submit(rollout, 10).result(TIMEOUT)
        ex.submit(look, 1).result(TIMEOUT)
        rows = {}
        began = time.perf_counter()
        for _ in range(3):
            steps = ex.submit(rollout, 300_000).result(TIMEOUT)
        rows["rollouts_large"] = time.perf_counter() - began
        assert type(steps[0]) is Step and len(steps) == 300_000
        del steps
        began = time.perf_counter()
        small = list(ex.map(rollout, [200] * 2000, timeout=TIMEOUT))
        rows["rollouts_small"] = time.perf_counter() - began
        assert type(small[-1][-1]) is Step
        del small
        began = time.perf_counter()
        looked = list(ex.map(look, range(200), timeout=TIMEOUT))
        rows["table_map"] = time.perf_counter() - began
        began = time.perf_counter()
        futures = [ex.submit(look, i) for i in range(200)]
        assert [f.result(TIMEOUT) for f in futures] == looked == [7.0 * i for i in range(200)]
        rows["table_submits"] = time.perf_counter() - began
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=str(HERE / "script_data.json"))
    options = parser.parse_args()
    if options.one:
        print(json.dumps(measure(options.one)))
        return
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    for repeat in range(options.repeat):
        order = SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]
        for system in order:
            done = subprocess.run([sys.executable, "-m", "benchmarks.script_data", "--one",
                                   system], capture_output=True, text=True, check=True,
                                  timeout=4 * TIMEOUT, cwd=HERE.parent)
            runs[system].append(json.loads(done.stdout.splitlines()[-1]))
            print(f"  [{repeat + 1}/{options.repeat}] {system}: {runs[system][-1]}",
                  file=sys.stderr)
    print("| row | stdlib | fiberexec | fiberexec/stdlib | all ratios |")
    print("|---|---|---|---|---|")
    table = {}
    for row, title in ROWS.items():
        ours = statistics.median(r[row] for r in runs["fiberexec"])
        ref = statistics.median(r[row] for r in runs["stdlib"])
        ratios = [f"{a[row] / b[row]:.2f}" for a, b in zip(runs["fiberexec"], runs["stdlib"],
                                                              strict=True)]
        table[row] = {"stdlib": ref, "fiberexec": ours, "ratio": ours / ref}
        print(f"| {title} | {ref:.2f} | {ours:.2f} | {ours / ref:.2f}x | {', '.join(ratios)} |")
    Path(options.output).write_text(json.dumps({"rows": table, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
