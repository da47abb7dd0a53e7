"""``fiberexec top``: a live view of an executor's workers, their tasks, and its failures.

It attaches to an executor of this user on this machine made with ``observe=True``, through
`fiberexec.observe`, and redraws in place with ANSI escapes every ``--interval`` seconds on a
terminal; to a file or a pipe it writes plain frames, one after another (``--once``: one
snapshot, no escapes). A task running more than `STRAGGLER` times its function's median run
time, and over `STRAGGLER_MIN` seconds, is a straggler (the dashboard's rule): marked ``!``
and shown in red on a terminal.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from fiberexec.observe import ExecutorEntry, list_executors, snapshot

STRAGGLER = 3.0  # times the function's median run time
STRAGGLER_MIN = 1.0  # seconds: a 0.3 s chunk among 30 ms tasks is not held up (dashboard.js)
EXIT_NONE, EXIT_USAGE, EXIT_UNANSWERED = 1, 2, 3
NONE_RUNNING = ("no executor with observe=True is running for this user on this machine; "
                "make one with FiberExecutor(observe=True) or FIBEREXEC_OBSERVE=1 (it is "
                "seen from its first submit, when its workers start)")
_RED, _DIM, _BOLD, _RESET = "\x1b[1;31m", "\x1b[2m", "\x1b[1m", "\x1b[0m"
_CLEAR = "\x1b[H\x1b[2J"
_ORDER = {"running": 0, "starting": 1, "idle": 2, "retired": 3, "lost": 4}


def run(executor: str | None, *, once: bool, interval: float, out: TextIO = sys.stdout) -> int:
    entries = list_executors()
    entry = _choose(entries, executor)
    if entry is None:
        return EXIT_NONE if not entries else EXIT_USAGE
    if once:
        try:
            out.write(render(snapshot(entry), color=False))
        except ConnectionError as exc:
            print(f"fiberexec top: {_unanswered(entry, exc)}", file=sys.stderr)
            return EXIT_UNANSWERED
        return 0
    stop = threading.Event()
    try:
        while True:
            try:
                view = snapshot(entry)
            except ConnectionError as exc:
                if entry.ended():
                    out.write(f"executor {entry.executor_id} (pid {entry.pid}) has ended\n")
                    return 0
                out.write(f"{_unanswered(entry, exc)}; asking again\n")
                out.flush()
                stop.wait(interval)
                continue
            out.write(_frame(view, out.isatty()))
            out.flush()
            stop.wait(interval)  # the refresh period: nothing to wait for but the clock
    except KeyboardInterrupt:
        out.write("\n")
        return 0


def _unanswered(entry: ExecutorEntry, exc: ConnectionError) -> str:
    if entry.ended():
        return f"executor {entry.executor_id} (pid {entry.pid}) has ended"
    return (f"{exc} (its process is alive: stopped, or too busy to answer; "
            f"`fiberexec top` asks again)")


def _frame(view: Mapping[str, Any], terminal: bool) -> str:
    """A terminal's screen, redrawn in place, each line fitted to its width; else a plain
    frame (a file, a pipe), all of it, lines whole, and followed by a blank line."""
    if not terminal:
        return render(view, width=None) + "\n"
    size = shutil.get_terminal_size((120, 40))
    return _CLEAR + render(view, width=size.columns, height=size.lines, color=True)


def matching(entries: Sequence[ExecutorEntry], wanted: str) -> list[ExecutorEntry]:
    """The executors ``wanted`` names: by id or pid, else those whose id it is the start of."""
    exact = [e for e in entries if wanted in (e.executor_id, str(e.pid))]
    return exact or [e for e in entries if e.executor_id.startswith(wanted)]


def _choose(entries: Sequence[ExecutorEntry], wanted: str | None) -> ExecutorEntry | None:
    if not entries:
        print(f"fiberexec top: {NONE_RUNNING}", file=sys.stderr)
        return None
    if wanted is not None:
        found = matching(entries, wanted)
        if len(found) == 1:
            return found[0]
        if found:
            print(f"fiberexec top: --executor {wanted!r} names {len(found)} executors (their "
                  f"process, or the start of their ids); give more of an id:\n"
                  f"{listing(found)}", file=sys.stderr)
            return None
        print(f"fiberexec top: no executor {wanted!r} (an id, the start of one, or a pid) "
              f"among:\n{listing(entries)}", file=sys.stderr)
        return None
    if len(entries) == 1:
        return entries[0]
    print(f"fiberexec top: {len(entries)} executors are running; pick one with "
          f"--executor ID:\n{listing(entries)}", file=sys.stderr)
    return None


def listing(entries: Sequence[ExecutorEntry]) -> str:
    now = time.time()
    return "\n".join(f"  {e.executor_id}  pid {e.pid:<7} {e.backend:<10} "
                     f"up {_duration(now - e.started):>7}  {e.program}" for e in entries)


# ---------------------------------------------------------------------------- drawing


def render(view: Mapping[str, Any], *, width: int | None = 120, height: int | None = None,
           color: bool = False) -> str:
    """One screen of ``view`` (a snapshot); ``width`` None: lines whole; ``height`` None:
    every worker. A line or cell cut short ends in an ellipsis."""
    now = float(view["time"])
    workers = sorted(view["workers"], key=lambda w: (_ORDER.get(w["state"], 9),
                                                     -_running_for(w, now)))
    failures = _failures(view["failures"], view["stats"]["tasks_failed"], width)
    head = [*_header(view, workers), ""]
    room = None if height is None else max(1, height - len(head) - 1 - len(failures) - 2)
    shown = workers if room is None else workers[:room]
    rows = [_worker_cells(worker, view["medians"], now) for worker in shown]
    widths = _widths([_HEADINGS, *(cells for cells, _ in rows)])
    lines = [*head, _row(_HEADINGS, widths, width)]
    for cells, style in rows:
        line = _row(cells, widths, width)
        lines.append(style + line + _RESET if color and style else line)
    if len(shown) < len(workers):
        lines.append(f"  ... {len(workers) - len(shown)} more")
    return "\n".join([*lines, *failures]) + "\n"


def _header(view: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]) -> list[str]:
    stats = view["stats"]
    states = {state: sum(w["state"] == state for w in workers) for state in _ORDER}
    clock = time.strftime("%H:%M:%S", time.localtime(float(view["time"])))
    return [
        f"fiberexec top - executor {view['executor_id']} (pid {view['pid']}, "
        f"{view['backend']}, max_workers={view['max_workers']})  {clock}",
        "workers: " + ", ".join(f"{n} {state}" for state, n in states.items()),
        f"tasks: {stats['tasks_pending']} pending, {stats['tasks_running']} running, "
        f"{stats['tasks_done']} done, {stats['tasks_failed']} failed, "
        f"{stats['tasks_retried']} retried; {view['throughput']:.1f} tasks/s "
        f"(last {view.get('window', 10):.2g} s)",
    ]


def _worker_cells(worker: Mapping[str, Any], medians: Mapping[str, float],
                  now: float) -> tuple[tuple[str, ...], str]:
    """A worker's row, and its style: red for a straggler, dim for one gone, else none."""
    task = worker["task"]
    running = _running_for(worker, now)
    what, late = worker.get("ended") or "", False  # (how a gone one ended)
    if task is not None:
        what = f"{task['function']}({task['arguments']})"
        # a function none of whose tasks has finished: judged by every task's median
        median = medians.get(task["function"], medians.get("*"))
        late = (median is not None and running > STRAGGLER_MIN
                and running > STRAGGLER * max(median, 1e-3))
    cells = (worker["worker_id"], worker["host"], worker["state"],
             (_duration(running) + (" !" if late else "")) if task else "",
             str(worker["tasks_done"]), str(worker["tasks_failed"]),
             "" if worker["cpu_percent"] is None else f"{worker['cpu_percent']:.0f}",
             _bytes(worker["rss_bytes"]), what)
    style = _RED if late else _DIM if worker["state"] in ("lost", "retired") else ""
    return cells, style


def _failures(failures: Sequence[Mapping[str, Any]], failed: int,
              width: int | None) -> list[str]:
    """The latest few failures, under a head saying how many of how many failed."""
    if not failures:
        return []
    shown = failures[-FAILURES_SHOWN:]
    lines = ["", f"last failures ({len(shown)} of {max(failed, len(shown))} failed):"]
    for f in shown:
        where = f" on {f['worker_id']}" if f["worker_id"] else ""
        lines.append(_fit(f"  task {f['task_id']}{where}: {f['function']}"
                          f"({f['arguments']}): {f['error']}", width))
    return lines


FAILURES_SHOWN = 5
_HEADINGS = ("WORKER", "HOST", "STATE", "FOR", "DONE", "FAIL", "CPU%", "RSS", "TASK")
# Each column but the last, TASK, is as wide as what it shows now, within these bounds, so
# that TASK, which takes the rest, keeps room on an 80-column terminal. The columns whose
# values grow as tasks run are wide enough from the start not to move at every redraw.
_NARROWEST = (6, 4, 8, 7, 5, 4, 4, 5)
_WIDEST = (8, 14, 8, 9, 6, 5, 5, 7)


def _widths(rows: Sequence[Sequence[str]]) -> tuple[int, ...]:
    return tuple(max(narrowest, min(widest, max(len(row[i]) for row in rows)))
                 for i, (narrowest, widest) in enumerate(zip(_NARROWEST, _WIDEST, strict=True)))


def _row(cells: Sequence[str], widths: Sequence[int], width: int | None) -> str:
    head = " ".join(_fit(c, w).ljust(w) for c, w in zip(cells, widths, strict=False))
    return _fit(f"{head} {cells[-1]}".rstrip(), width)


def _fit(text: str, width: int | None) -> str:
    """``text``, or as much as fits in ``width`` ending in an ellipsis (None: all of it)."""
    if width is None or len(text) <= width:
        return text
    return text[:max(0, width - 1)] + "\u2026"


def _running_for(worker: Mapping[str, Any], now: float) -> float:
    task = worker["task"]
    return max(0.0, now - float(task["started"])) if task else 0.0


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def _bytes(n: int | None) -> str:
    if not n:
        return ""
    value = float(n)
    for unit in "BKMGT":
        if value < 1024 or unit == "T":
            return f"{value:.1f}{unit}" if value < 10 and unit != "B" else f"{value:.0f}{unit}"
        value /= 1024
    return ""  # not reached: "T" takes everything left
