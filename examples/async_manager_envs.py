"""Step N remote environments in parallel with an AsyncManager, and compare with in turn.

    python examples/async_manager_envs.py --envs 8 --rounds 20
    python examples/async_manager_envs.py --small     # what the tests run
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import wait

import fiberexec.multiprocessing as mp


class Env:
    """A stand-in simulator: each step waits ~15 ms, as if on a physics engine."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def step(self, action: int) -> int:
        time.sleep(0.015)
        self.state += action
        return self.state


mp.AsyncManager.register("Env", Env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=8, help="environments (default 8)")
    parser.add_argument("--rounds", type=int, default=20, help="steps of each (default 20)")
    parser.add_argument("--small", action="store_true", help="2 environments, 3 rounds")
    args = parser.parse_args()
    n, rounds = (2, 3) if args.small else (args.envs, args.rounds)
    with mp.AsyncManager() as manager:
        envs = [manager.Env(i) for i in range(n)]  # type: ignore[attr-defined]
        start = time.perf_counter()
        for _ in range(rounds):
            for env in envs:
                env.step(1).result()
        in_turn = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(rounds):
            wait([env.step(1) for env in envs])
        parallel = time.perf_counter() - start
    print(f"{n} envs x {rounds} steps: in turn {in_turn:.3f}s, parallel {parallel:.3f}s, "
          f"speedup {in_turn / parallel:.1f}x")


if __name__ == "__main__":
    main()
