"""A PPO-style rollout written for `multiprocessing`; one import line selects the library.

N environment processes are stepped through `Pipe`s; each writes its observation into a
shared-memory `Array` that the learner reads without a copy (numpy views), as vectorised
environment libraries do in their shared-memory mode. The environment is a small cart-pole
(no gym needed) with seeded noise; the policy is a fixed linear one, so the same seeds give
the same trajectories with either library.

    python examples/ppo_rollout.py --mp stdlib        # import multiprocessing as mp
    python examples/ppo_rollout.py --mp fiberexec     # import fiberexec.multiprocessing as mp
    python examples/ppo_rollout.py --small            # what the tests run

It prints a digest of the trajectories and the environment steps per second.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import math
import random
import time
from typing import Any

import numpy as np

OBS = 4
GRAVITY, CART_MASS, POLE_MASS, HALF_POLE, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


def _cost(seconds: float) -> None:
    """What a real simulator step costs: sleep for long steps, spin for short ones."""
    if seconds >= 1e-3:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class CartPole:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = [0.0] * OBS
        self.reset()

    def reset(self) -> list[float]:
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(OBS)]
        return self.state

    def step(self, action: int) -> tuple[list[float], float, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = (FORCE if action else -FORCE) + self.rng.gauss(0.0, 0.5)
        cos, sin = math.cos(theta), math.sin(theta)
        total = CART_MASS + POLE_MASS
        temp = (force + POLE_MASS * HALF_POLE * theta_dot**2 * sin) / total
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_POLE * (4.0 / 3.0 - POLE_MASS * cos**2 / total))
        x_acc = temp - POLE_MASS * HALF_POLE * theta_acc * cos / total
        self.state = [x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot,
                      theta_dot + TAU * theta_acc]
        done = abs(self.state[0]) > 2.4 or abs(self.state[2]) > 0.21
        if done:
            self.reset()
        return self.state, 1.0, done


def env_worker(index: int, seed: int, conn: Any, shared: Any, cost: float) -> None:
    """One environment: commands arrive on ``conn``; observations go to ``shared``."""
    obs = np.frombuffer(shared.get_obj(), dtype=np.float64).reshape(-1, OBS)
    env = CartPole(seed)
    obs[index] = env.state
    conn.send("ready")
    while True:
        command, action = conn.recv()
        if command == "close":
            conn.close()
            return
        _cost(cost)
        state, reward, done = env.step(action)
        obs[index] = state  # in shared memory: the learner reads it without a copy
        conn.send((reward, done))


def policy(obs: np.ndarray) -> np.ndarray:
    """A fixed linear policy: push towards the side the pole is falling to."""
    return (obs @ np.array([0.0, 0.1, 1.0, 0.5]) > 0).astype(int)


def rollout(mp: Any, n_envs: int, steps: int, seed: int, cost: float) -> tuple[str, float]:
    """Run ``steps`` synchronous steps of ``n_envs`` environments; (digest, steps/s)."""
    ctx = mp.get_context("spawn")
    shared = ctx.Array("d", n_envs * OBS)
    obs = np.frombuffer(shared.get_obj(), dtype=np.float64).reshape(n_envs, OBS)
    pipes = [ctx.Pipe() for _ in range(n_envs)]
    procs = [ctx.Process(target=env_worker, args=(i, seed + i, child, shared, cost), daemon=True)
             for i, (_, child) in enumerate(pipes)]
    for proc in procs:
        proc.start()
    for parent, child in pipes:
        child.close()
        assert parent.recv() == "ready"
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(steps):
        actions = policy(obs)
        for (parent, _), action in zip(pipes, actions, strict=True):
            parent.send(("step", int(action)))
        results = [parent.recv() for parent, _ in pipes]
        digest.update(obs.tobytes() + actions.tobytes() + repr(results).encode())
    elapsed = time.perf_counter() - start
    for parent, _ in pipes:
        parent.send(("close", 0))
    for proc in procs:
        proc.join(30)
    return digest.hexdigest()[:16], n_envs * steps / elapsed


def load(name: str) -> Any:
    """The one line that differs: the stdlib's module or fiberexec's."""
    return importlib.import_module(
        "multiprocessing" if name == "stdlib" else "fiberexec.multiprocessing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mp", choices=["stdlib", "fiberexec"], default="fiberexec")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-cost", type=float, default=1e-3, help="seconds per env step")
    parser.add_argument("--small", action="store_true", help="2 environments, 20 steps")
    args = parser.parse_args()
    envs, steps = (2, 20) if args.small else (args.envs, args.steps)
    digest, rate = rollout(load(args.mp), envs, steps, args.seed, args.step_cost)
    print(f"{args.mp}: {envs} environments x {steps} steps: trajectory {digest}, "
          f"{rate:.0f} env steps/s")


if __name__ == "__main__":
    main()
