"""Turn medians into the markdown table, the JSON file and the plot.

``results`` maps a row key to ``{system: metrics}``; a system's metrics may be
``{"error": ...}`` when its measurement failed, which the table shows instead of a number.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Metrics = dict[str, Any]
Results = dict[str, dict[str, Metrics]]


@dataclass(frozen=True)
class Row:
    """How one workload is shown and judged."""

    key: str
    label: str
    value: Callable[[Metrics], float]  # the headline number (ratios and the plot use it)
    show: Callable[[Metrics], str]  # the cell text
    target: str
    holds: Callable[[dict[str, Metrics]], bool]  # given every system's metrics
    higher_is_better: bool = True
    plot_target: Callable[[dict[str, Metrics]], float] | None = None  # as speedup vs stdlib


def _num(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.1f}k"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _fx(by: dict[str, Metrics]) -> Metrics:
    return by["fiberexec"]


def _eff_row(key: str, label: str, target: float, *, at_least_stdlib: bool = False) -> Row:
    """An efficiency row: ``>= target``, and with ``at_least_stdlib`` also ``>=`` the stdlib's."""

    def floor(by: dict[str, Metrics]) -> float:
        return max(target, by["stdlib"]["efficiency"]) if at_least_stdlib else target

    return Row(
        key, label, lambda m: m["efficiency"], lambda m: f"{m['efficiency']:.2f}",
        f">= stdlib's and >= {target:.2f}" if at_least_stdlib else f">= {target:.2f}",
        lambda by: _fx(by)["efficiency"] >= floor(by),
        plot_target=lambda by: floor(by) / by["stdlib"]["efficiency"],
    )


def _time_row(key: str, label: str, limit: float) -> Row:
    return Row(
        key, label, lambda m: m["seconds"], _time_cell,
        f"<= {limit:.2f}", lambda by: _fx(by)["seconds"] <= limit, higher_is_better=False,
        plot_target=lambda by: by["stdlib"]["seconds"] / limit,
    )


def _time_cell(m: Metrics) -> str:
    text = f"{m['seconds']:.3f}"
    method = m.get("start_method")
    return f"{text} ({method.split(' ')[0]})" if method else text


def _sim_row(shards: int, workers: int = 1024, key: str = "") -> Row:
    return Row(
        key or f"simulated_{shards}",
        f"{workers} simulated workers, shards={shards}: dispatch tasks/s (connect s; "
        f"`workers()` ms idle / in a flood)",
        lambda m: m["tasks_per_s"],
        lambda m: f"{_num(m['tasks_per_s'])} ({m['connect_s']:.2f} s, {m['workers']} conn.; "
                  f"{m.get('workers_idle_ms', 0):.1f} / {m.get('workers_busy_ms', 0):.1f} ms)",
        f"{workers} connected, >= 50k tasks/s, `workers()` < 20 ms",
        lambda by: _fx(by)["workers"] >= workers and _fx(by)["tasks_per_s"] >= 50_000
        and max(_fx(by).get("workers_idle_ms", 0), _fx(by).get("workers_busy_ms", 0)) < 20,
    )


ROWS: list[Row] = [
    Row("submit", "no-op `submit`, tasks/s", lambda m: m["tasks_per_s"],
        lambda m: _num(m["tasks_per_s"]), ">= 8x stdlib",
        lambda by: _fx(by)["tasks_per_s"] >= 8 * by["stdlib"]["tasks_per_s"],
        plot_target=lambda by: 8.0),
    Row("map", "no-op `map`, chunked, tasks/s", lambda m: m["tasks_per_s"],
        lambda m: _num(m["tasks_per_s"]), ">= 1.2x mp.Pool",
        lambda by: _fx(by)["tasks_per_s"] >= 1.2 * by["mp.Pool"]["tasks_per_s"],
        plot_target=lambda by: 1.2 * by["mp.Pool"]["tasks_per_s"] / by["stdlib"]["tasks_per_s"]),
    _eff_row("barrier", "1 ms tasks, barrier rounds of 64, efficiency", 0.80),
    _eff_row("rounds_n", "1 ms tasks in rounds of N = workers (2), efficiency", 0.80,
             at_least_stdlib=True),
    Row("small_maps", "maps of 16 x 0.4 ms CPU items, one after another: efficiency (ms a map)",
        lambda m: m["efficiency"], lambda m: f"{m['efficiency']:.2f} ({m['map_ms']:.2f})",
        "time <= 1.1x mp.Pool's (the libraries' target)",
        lambda by: _fx(by)["map_ms"] <= 1.1 * by["mp.Pool"]["map_ms"],
        plot_target=lambda by: by["mp.Pool"]["efficiency"] / 1.1 / by["stdlib"]["efficiency"]),
    _eff_row("burst", "1 ms tasks, all at once, efficiency", 0.90, at_least_stdlib=True),
    Row("latency", "single-task round trip p50 / p99, us", lambda m: m["p50_us"],
        lambda m: f"{m['p50_us']:.0f} / {m['p99_us']:.0f}",
        "p50 <= 0.75x stdlib's and <= mp.Pool's, p99 <= 2x p50",
        lambda by: _fx(by)["p50_us"] <= 0.75 * by["stdlib"]["p50_us"]
        and _fx(by)["p50_us"] <= by["mp.Pool"]["p50_us"]
        and _fx(by)["p99_us"] <= 2 * _fx(by)["p50_us"],
        higher_is_better=False,
        # as a speedup over the stdlib: the stricter of 1 / 0.75 and matching mp.Pool's p50
        plot_target=lambda by: max(1 / 0.75, by["stdlib"]["p50_us"] / by["mp.Pool"]["p50_us"])),
    Row("array", "10 MiB array to / from a task, MiB/s", lambda m: m["to_mib_s"],
        lambda m: f"{m['to_mib_s']:.0f} / {m['from_mib_s']:.0f}", ">= 2000 both ways",
        lambda by: min(_fx(by)["to_mib_s"], _fx(by)["from_mib_s"]) >= 2000,
        plot_target=lambda by: 2000 / by["stdlib"]["to_mib_s"]),
    Row("objects", "18 MiB list of 1,000,000 strings to / from a task, MiB/s",
        lambda m: m["to_mib_s"],
        lambda m: f"{m['to_mib_s']:.0f} / {m['from_mib_s']:.0f}", ">= stdlib's both ways",
        lambda by: _fx(by)["to_mib_s"] >= by["stdlib"]["to_mib_s"]
        and _fx(by)["from_mib_s"] >= by["stdlib"]["from_mib_s"],
        plot_target=lambda by: 1.0),
    _time_row("first_result", "construct to first result, s", 0.10),
    Row("remake", "executors one after another: made, 8 tasks, shut down; median s (first)",
        lambda m: m["seconds"], lambda m: f"{m['seconds']:.3f} ({m['first_s']:.3f})",
        "<= 2x stdlib's", lambda by: _fx(by)["seconds"] <= 2 * by["stdlib"]["seconds"],
        higher_is_better=False, plot_target=lambda by: 0.5),
    _time_row("shutdown", "shutdown, s", 0.1),
    _eff_row("es", "ES generation (population x ~2 ms tasks), efficiency", 0.95),
    Row("es_8mb", "ES, 8 MiB vector read by 64 tasks x 5 generations, s (MiB sent/gen.)",
        lambda m: m["elapsed_s"],
        lambda m: f"{m['elapsed_s']:.2f}" + (f" ({m['vector_mib_sent_per_generation']:.0f})"
                                             if "vector_mib_sent_per_generation" in m else ""),
        "<= 1/3 of stdlib's time, ~workers x 8 MiB sent per generation",
        lambda by: _fx(by)["elapsed_s"] * 3 <= by["stdlib"]["elapsed_s"]
        and _fx(by)["vector_mib_sent_per_generation"] <= 2 * 8 * 1.05,
        higher_is_better=False, plot_target=lambda by: 3.0),
    Row("matmul", "numpy 300 x 300 matrix products in tasks, each program's threads as it "
        "starts (no thread variables set): s for the tasks (ms a task)",
        lambda m: m["seconds"], lambda m: f"{m['seconds']:.2f} ({m['task_ms']:.1f})",
        "<= stdlib's time", lambda by: _fx(by)["seconds"] <= by["stdlib"]["seconds"],
        higher_is_better=False, plot_target=lambda by: 1.0),
    _sim_row(1),
    _sim_row(4),
    _sim_row(1, 4096, "simulated_4096"),
    Row("output", "no-op `submit` while a task prints 10 MiB, forwarded vs printed to "
        "/dev/null, one executor: executor CPU us/task (tasks/s)",
        lambda m: m["forward_tasks_per_s"],
        lambda m: f"{m['forward_cpu_us']:.0f} vs {m['silent_cpu_us']:.0f} "
                  f"({100 * m['slowdown']:+.1f}%{_spread(m.get('slowdowns'))}; "
                  f"{_num(m['forward_tasks_per_s'])} vs {_num(m['silent_tasks_per_s'])})",
        "CPU per task within +5%", lambda by: _fx(by)["slowdown"] <= 0.05),
]


def _spread(ratios: list[float] | None) -> str:
    """The range of a paired measurement's per-pair ratios, as percentages."""
    if not ratios:
        return ""
    return f", pairs {100 * min(ratios):+.0f}% to {100 * max(ratios):+.0f}%"


def _ok(m: Metrics | None) -> bool:
    return m is not None and "error" not in m


def _ratio(row: Row, by: dict[str, Metrics], other: str) -> str:
    a, b = by.get("fiberexec"), by.get(other)
    if not (_ok(a) and _ok(b)):
        return "-"
    assert a is not None
    assert b is not None
    text = f"{row.value(a) / row.value(b):.2f}x"
    if row.key in ("array", "objects"):
        text += f" / {a['from_mib_s'] / b['from_mib_s']:.2f}x"
    return text


def _verdict(row: Row, by: dict[str, Metrics]) -> str:
    needed = ("fiberexec",) if row.key.startswith(("simulated", "output")) else tuple(by)
    if not all(_ok(by.get(s)) for s in needed) or not _ok(by.get("fiberexec")):
        return "not measured"
    try:
        return "holds" if row.holds(by) else "falls short"
    except KeyError:
        return "not measured"


def _cell(row: Row, m: Metrics | None) -> str:
    if m is None:
        return "-"
    if "error" in m:
        return f"error: {m['error'][:60]}"
    return row.show(m)


def table(results: Results) -> str:
    """The markdown table: every system's value, fiberexec's ratios, the target, a verdict."""
    lines = [
        "| workload | stdlib ProcessPool | mp.Pool | fiberexec | fiberexec/stdlib "
        "| fiberexec/mp.Pool | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        by = results.get(row.key)
        if not by:
            continue
        cells = [_cell(row, by.get(s)) for s in ("stdlib", "mp.Pool", "fiberexec")]
        ratios = [_ratio(row, by, "stdlib"), _ratio(row, by, "mp.Pool")]
        lines.append(f"| {row.label} | {' | '.join(cells)} | {' | '.join(ratios)} "
                     f"| {row.target} | {_verdict(row, by)} |")
    return "\n".join(lines)


def write_json(path: Path, results: Results, meta: dict[str, Any]) -> None:
    verdicts = {row.key: _verdict(row, results[row.key]) for row in ROWS if row.key in results}
    path.write_text(json.dumps({"meta": meta, "results": results, "verdicts": verdicts},
                               indent=2, sort_keys=True) + "\n")


def plot(path: Path, results: Results) -> None:
    """Bars: each system's speedup over the stdlib (higher is better), target as a red line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in ROWS if r.plot_target is not None and r.key in results
            and all(_ok(results[r.key].get(s)) for s in ("stdlib", "mp.Pool", "fiberexec"))]
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.38
    for i, row in enumerate(rows):
        by = results[row.key]
        for offset, system, color in ((-width / 2, "mp.Pool", "#9aa5b1"),
                                      (width / 2, "fiberexec", "#2b6cb0")):
            ax.bar(i + offset, _speedup(row, by[system], by["stdlib"]), width, color=color,
                   label=system if i == 0 else "_nolegend_")
        assert row.plot_target is not None
        ax.hlines(row.plot_target(by), i - 0.45, i + 0.45, colors="#c53030", linewidth=2,
                  label="fiberexec target" if i == 0 else "_nolegend_")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.key for r in rows], rotation=20)
    ax.set_ylabel("speedup over stdlib ProcessPoolExecutor (log; higher is better)")
    ax.set_title("fiberexec benchmarks, 2 workers (time and latency rows inverted)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _speedup(row: Row, m: Metrics, stdlib: Metrics) -> float:
    ratio = row.value(m) / row.value(stdlib)
    return ratio if row.higher_is_better else 1 / ratio
