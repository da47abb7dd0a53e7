"""`fiberexec.multiprocessing` against `multiprocessing` on one host, in the same run.

Each measurement runs in a fresh process (``python -m benchmarks.mp_bench --one ...``), the
standard library first, then fiberexec, and each row shows the ratio to the stdlib and its
target. Run from the repository root::

    python -m benchmarks.mp_bench                 # about a minute
    python -m benchmarks.mp_bench --quick         # smaller sizes
    python -m benchmarks.mp_bench --repeat 3      # each row 3 times: median of the ratios

With ``--repeat``, each repeat measures the stdlib and then fiberexec, so every ratio is
taken in the same moment of a noisy machine; the row shows the median ratio (and the
rates of that repeat) and lists every ratio.

Rows: Pipe round trips per second (parent <-> child echo, and between two children of
the parent that created the pipe), Queue put/get items per second
(a child puts, the parent gets; the parent puts, a child gets; and one child puts, another
gets, through a queue the parent created; timed once the other process runs), and the
PPO-style rollout of ``examples/ppo_rollout.py``
(4 environments stepped through pipes, observations in a shared `Array`) at 1 ms and 10 us
per environment step, and method calls on a `Manager` dict's proxy. Then the RL rows of
`benchmarks.mp_rl`: a hand-written `Pipe`/`Process` vector env and gymnasium's
``AsyncVectorEnv`` (steps per second, 4 environments), and the seconds to start and join 4
processes (a ceiling: fiberexec's time over the stdlib's ``spawn``). Then synchronisation:
``Event.is_set()`` calls per second in a child, and increments per second of a shared
`Value` under its lock by 4 children at once. Last, ``Pool(2).map`` calls per second over 16
quick items (an optimiser's generation of a cheap objective: what the pool costs a map),
and ``Pool(2).apply`` calls per second (a round trip each). ``--rows a,b`` runs some.

The pipe row times 40,000 round trips and the 10 us rollout 4,000 steps (a second or two
each): a run of a few hundred milliseconds mostly catches the two processes of a pair still
sharing the CPU they started on, before the scheduler spreads them over the machine's CPUs,
and measures that start instead of the steady state a long rollout runs in (see
``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import mp_rl

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"pipe_roundtrips": 0.9, "pipe_roundtrips_children": 0.9, "queue_items": 0.5,
           "queue_items_to_child": 0.8, "queue_items_children": 0.5, "rollout_1ms": 0.9,
           "rollout_10us": 0.9, "manager_calls": 0.5, "pipe_vector_env": 0.9,
           "gym_vector_env": 0.9, "start_join_4": 2.0, "event_checks": 0.5,
           "locked_counter_4": 0.5, "pool_maps": 0.9, "pool_applies": 0.9,
           # ours, not an issue's: the stdlib's pool on our context keeps half its own speed
           "stdlib_pool_maps": 0.5}
LOWER_IS_BETTER = {"start_join_4"}  # seconds, not a rate: the target is a ceiling
SYSTEMS = {"stdlib": "multiprocessing", "fiberexec": "fiberexec.multiprocessing"}
START_METHODS = {"stdlib": "spawn", "fiberexec": "fiber"}  # a library's start method name


def echo(conn: Any) -> None:
    while True:
        try:
            conn.send_bytes(conn.recv_bytes())
        except EOFError:
            return


def roundtrips(conn: Any, n: int) -> float:
    """Round trips per second over ``conn`` to an `echo` (after one to warm up)."""
    conn.send_bytes(b"warm")
    conn.recv_bytes()
    start = time.perf_counter()
    for _ in range(n):
        conn.send_bytes(b"x" * 64)
        conn.recv_bytes()
    return n / (time.perf_counter() - start)


def drive(conn: Any, n: int, out: Any) -> None:
    out.put(roundtrips(conn, n))
    conn.close()


def pipe_roundtrips_children(mp: Any, n: int) -> float:
    """Round trips between two children over a pipe the parent created."""
    one, other = mp.Pipe()
    out = mp.Queue()
    echoer = mp.Process(target=echo, args=(other,))
    driver = mp.Process(target=drive, args=(one, n, out))
    return _pair_rate(out, echoer, driver, (one, other))


def _pair_rate(out: Any, first: Any, second: Any, close: tuple[Any, ...] = ()) -> float:
    """Start two children, close the ends in ``close`` here, and return the rate one of
    them puts to ``out``."""
    first.start()
    second.start()
    for end in close:
        end.close()
    rate = float(out.get(timeout=120))
    second.join(30)
    first.join(30)
    return rate


def produce(q: Any, n: int) -> None:
    for i in range(n):
        q.put(i)


def pipe_roundtrips(mp: Any, n: int) -> float:
    here, there = mp.Pipe()
    p = mp.Process(target=echo, args=(there,))
    p.start()
    there.close()
    rate = roundtrips(here, n)
    here.close()
    p.join(30)
    return rate


def queue_items(mp: Any, n: int) -> float:
    q = mp.Queue()
    p = mp.Process(target=produce, args=(q, n + 1))
    p.start()
    q.get(timeout=60)  # the producer runs: from here on, only put/get are timed
    start = time.perf_counter()
    for _ in range(n):
        q.get(timeout=60)
    rate = n / (time.perf_counter() - start)
    p.join(30)
    return rate


def consume(q: Any, done: Any, n: int) -> None:
    q.get(timeout=60)
    done.put("ready")
    for _ in range(n):
        q.get(timeout=60)
    done.put(n)


def queue_items_to_child(mp: Any, n: int) -> float:
    q, done = mp.Queue(), mp.Queue()
    p = mp.Process(target=consume, args=(q, done, n))
    p.start()
    q.put(-1)
    assert done.get(timeout=60) == "ready"  # the consumer runs: only put/get are timed
    start = time.perf_counter()
    for i in range(n):
        q.put(i)
    done.get(timeout=120)
    rate = n / (time.perf_counter() - start)
    p.join(30)
    return rate


def produce_on_cue(q: Any, go: Any, n: int) -> None:
    q.put(-1)
    go.wait(60)
    produce(q, n)


def consume_in_order(q: Any, go: Any, out: Any, n: int) -> None:
    assert q.get(timeout=60) == -1
    go.set()  # the consumer waits: from here on, only put/get are timed
    start = time.perf_counter()
    for i in range(n):
        if q.get(timeout=60) != i:
            raise AssertionError(f"item {i} out of order")
    out.put(n / (time.perf_counter() - start))


def queue_items_children(mp: Any, n: int) -> float:
    """Items per second from one child to another through a queue the parent created."""
    q, go, out = mp.Queue(), mp.Event(), mp.Queue()
    consumer = mp.Process(target=consume_in_order, args=(q, go, out, n))
    producer = mp.Process(target=produce_on_cue, args=(q, go, n))
    return _pair_rate(out, consumer, producer)


def rollout(mp: Any, steps: int, cost: float) -> float:
    import ppo_rollout  # on PYTHONPATH (see `_fresh`), so children import it by name

    _, rate = ppo_rollout.rollout(mp, 4, steps, 0, cost)
    return float(rate)


def manager_calls(mp: Any, n: int) -> float:
    """Proxy method calls per second on a manager's dict, from the main thread."""
    with mp.Manager() as manager:
        shared = manager.dict({1: 2})
        for _ in range(200):  # the connection is made and warm
            shared[1]
        start = time.perf_counter()
        for _ in range(n):
            shared[1]
        return n / (time.perf_counter() - start)


def check_event(event: Any, n: int, out: Any) -> None:
    start = time.perf_counter()
    for _ in range(n):
        event.is_set()
    out.put(n / (time.perf_counter() - start))


def event_checks(mp: Any, n: int) -> float:
    """``Event.is_set()`` calls per second in a child (a loop that checks a stop flag each
    step)."""
    event, out = mp.Event(), mp.Queue()
    child = mp.Process(target=check_event, args=(event, n, out))
    child.start()
    rate = float(out.get(timeout=120))
    child.join(60)
    return rate


def count_under_lock(counter: Any, n: int, ready: Any, go: Any) -> None:
    ready.put(None)
    go.wait(120)
    for _ in range(n):
        with counter.get_lock():
            counter.value += 1


def locked_counter(mp: Any, n: int, children: int = 4) -> float:
    """Increments per second of a shared `Value` under its own lock, by ``children``
    processes at once (a step counter kept by every environment), timed from the moment
    all of them have started (the stdlib's spawned children start far apart, and would
    otherwise hardly contend)."""
    counter, ready, go = mp.Value("i", 0), mp.Queue(), mp.Event()
    procs = [mp.Process(target=count_under_lock, args=(counter, n, ready, go))
             for _ in range(children)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    start = time.perf_counter()
    go.set()
    for proc in procs:
        proc.join(120)
    elapsed = time.perf_counter() - start
    assert counter.value == n * children, counter.value
    return n * children / elapsed


def pool_maps(mp: Any, n: int, items: int = 16) -> float:
    """``Pool(2).map`` calls per second over ``items`` quick items (`abs`), on a warm pool."""
    return _maps(mp.Pool(2), n, items)


def stdlib_pool_maps(method: str, n: int, items: int = 16) -> float:
    """`pool_maps` on the standard library's own pool given the context ``method`` names, as
    ``multiprocessing.Pool()`` makes it after ``set_start_method(method)``."""
    import multiprocessing.pool

    if method == "fiber":
        import fiberexec  # noqa: F401  (makes the name known)
    return _maps(multiprocessing.pool.Pool(2, context=multiprocessing.get_context(method)),
                 n, items)


def _maps(made: Any, n: int, items: int) -> float:
    with made as pool:
        values = list(range(-items, 0))
        for _ in range(50):  # both workers started and warm
            pool.map(abs, values)
        start = time.perf_counter()
        for _ in range(n):
            assert pool.map(abs, values)[0] == items
        return n / (time.perf_counter() - start)


def pool_applies(mp: Any, n: int) -> float:
    """``Pool(2).apply`` calls per second (each a round trip to a worker), on a warm pool."""
    with mp.Pool(2) as pool:
        for i in range(200):  # both workers started and warm
            pool.apply(abs, (-i,))
        start = time.perf_counter()
        for i in range(n):
            assert pool.apply(abs, (-i,)) == i
        return n / (time.perf_counter() - start)


def measure(row: str, system: str, quick: bool) -> float:
    # spawn for both: a forked child would also hold the parent's pipe ends open
    mp = importlib.import_module(SYSTEMS[system]).get_context("spawn")
    scale = 1 if quick else 4
    runs: dict[str, Callable[[], float]] = {
        "pipe_roundtrips": lambda: pipe_roundtrips(mp, 10000 * scale),
        "pipe_roundtrips_children": lambda: pipe_roundtrips_children(mp, 10000 * scale),
        "queue_items": lambda: queue_items(mp, 1000 * scale),
        "queue_items_to_child": lambda: queue_items_to_child(mp, 1000 * scale),
        "queue_items_children": lambda: queue_items_children(mp, 25000 * scale),
        "rollout_1ms": lambda: rollout(mp, 50 * scale, 1e-3),
        "manager_calls": lambda: manager_calls(mp, 5000 * scale),
        "pipe_vector_env": lambda: mp_rl.pipe_vector_env(mp, 4, 500 * scale),
        "gym_vector_env": lambda: mp_rl.gym_vector_env(START_METHODS[system], 4, 500 * scale),
        "start_join_4": lambda: mp_rl.start_join(mp, 4),
        "event_checks": lambda: event_checks(mp, 50000 * scale),
        "locked_counter_4": lambda: locked_counter(mp, 5000 * scale),
        "pool_maps": lambda: pool_maps(mp, 500 * scale),
        "stdlib_pool_maps": lambda: stdlib_pool_maps(START_METHODS[system], 500 * scale),
        "pool_applies": lambda: pool_applies(mp, 1000 * scale),
    }
    return runs.get(row, lambda: rollout(mp, 1000 * scale, 1e-5))()


def _fresh(row: str, system: str, quick: bool) -> float:
    cmd = [sys.executable, "-m", "benchmarks.mp_bench", "--one", row, system]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}
    done = subprocess.run(cmd + (["--quick"] if quick else []), cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{row} on {system} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("ROW", "SYSTEM"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure each row this many times; report the median ratio")
    parser.add_argument("--rows", help="comma-separated rows to run (default: all)")
    args = parser.parse_args()
    if args.one:
        print(measure(args.one[0], args.one[1], args.quick))
        return
    rows = []
    print("| row | stdlib | fiberexec | ratio (median) | all ratios | target | met |")
    print("|---|---|---|---|---|---|---|")
    chosen = args.rows.split(",") if args.rows else list(TARGETS)
    for row in chosen:
        target = TARGETS[row]
        runs = []
        for _ in range(max(1, args.repeat)):
            std = _fresh(row, "stdlib", args.quick)
            ours = _fresh(row, "fiberexec", args.quick)
            runs.append((ours / std, std, ours))
        runs.sort()
        ratio, std, ours = runs[len(runs) // 2]
        rows.append({"row": row, "stdlib": std, "fiberexec": ours, "ratio": ratio,
                     "ratios": [r for r, _, _ in runs], "target": target})
        low = row in LOWER_IS_BETTER
        unit = "s" if low else "/s"
        met = ratio <= target if low else ratio >= target
        print(f"| {row} | {std:.3g}{unit} | {ours:.3g}{unit} | {ratio:.2f}x | "
              f"{', '.join(f'{r:.2f}' for r, _, _ in runs)} | {'<=' if low else '>='} "
              f"{target}x | {'yes' if met else 'NO'} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
