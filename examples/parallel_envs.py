"""Step many environments in parallel: a vectorised cart-pole on a FiberExecutor.

`ParallelEnvs` looks like a vectorised gym environment (``reset()``, ``step(actions)``), but
each environment's state travels with its step task, so any worker can step any environment
and a lost worker costs one step, which is simply sent again. The cart-pole is the classic
one (Barto, Sutton and Anderson, 1983) written in a few lines: no gym, no download. A step
holds the action for ``frame_skip`` physics steps.

    python examples/parallel_envs.py             # 16 environments, 200 steps
    python examples/parallel_envs.py --small     # what the tests run
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from fiberexec import FiberExecutor

GRAVITY, CART_MASS, POLE_MASS, HALF_POLE, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


@dataclass(frozen=True)
class CartPole:
    x: float = 0.0
    x_dot: float = 0.0
    theta: float = 0.0
    theta_dot: float = 0.0
    steps: int = 0

    @property
    def failed(self) -> bool:
        return abs(self.x) > 2.4 or abs(self.theta) > 12 * math.pi / 180

    def observation(self) -> tuple[float, float, float, float]:
        return (self.x, self.x_dot, self.theta, self.theta_dot)


def physics(s: CartPole, push: int) -> CartPole:
    """One Euler step of the cart-pole equations of motion."""
    force = FORCE if push else -FORCE
    cos, sin = math.cos(s.theta), math.sin(s.theta)
    total = CART_MASS + POLE_MASS
    temp = (force + POLE_MASS * HALF_POLE * s.theta_dot**2 * sin) / total
    theta_acc = (GRAVITY * sin - cos * temp) / (
        HALF_POLE * (4 / 3 - POLE_MASS * cos**2 / total))
    x_acc = temp - POLE_MASS * HALF_POLE * theta_acc * cos / total
    return CartPole(s.x + TAU * s.x_dot, s.x_dot + TAU * x_acc, s.theta + TAU * s.theta_dot,
                    s.theta_dot + TAU * theta_acc, s.steps + 1)


def step(state: CartPole, action: int, frame_skip: int) -> tuple[CartPole, float, bool]:
    """Apply ``action`` for ``frame_skip`` physics steps: new state, reward, done."""
    reward = 0.0
    for _ in range(frame_skip):
        state = physics(state, action)
        if state.failed:
            return state, reward, True
        reward += 1.0
    return state, reward, False


def fresh(seed: int) -> CartPole:
    rng = random.Random(seed)
    return CartPole(*(rng.uniform(-0.05, 0.05) for _ in range(4)))


class ParallelEnvs:
    """``n`` cart-poles stepped as tasks on ``executor``; finished ones restart on their own."""

    def __init__(self, executor: FiberExecutor, n: int, frame_skip: int = 2) -> None:
        self.executor, self.frame_skip = executor, frame_skip
        self.states = [fresh(i) for i in range(n)]
        self.episodes = 0

    def observations(self) -> list[tuple[float, float, float, float]]:
        return [s.observation() for s in self.states]

    def step(self, actions: list[int]) -> tuple[list[float], list[bool]]:
        futures = [self.executor.submit(step, s, a, self.frame_skip)
                   for s, a in zip(self.states, actions, strict=True)]
        results = [f.result() for f in futures]
        self.states, rewards, dones = [], [], []
        for i, (state, reward, done) in enumerate(results):
            if done:
                self.episodes += 1
            self.states.append(fresh(i * 100_003 + self.episodes) if done else state)
            rewards.append(reward)
            dones.append(done)
        return rewards, dones


def policy(obs: tuple[float, float, float, float]) -> int:
    """A hand-tuned linear controller: push towards where the pole is falling."""
    x, x_dot, theta, theta_dot = obs
    return int(0.1 * x + 0.5 * x_dot + 10 * theta + 2 * theta_dot > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--small", action="store_true", help="a quick run")
    args = parser.parse_args()
    if args.small:
        args.envs, args.steps = 4, 20
    with FiberExecutor(args.workers) as ex:
        envs = ParallelEnvs(ex, args.envs)
        total = 0.0
        for _ in range(args.steps):
            rewards, _ = envs.step([policy(o) for o in envs.observations()])
            total += sum(rewards)
    print(f"{args.envs} environments x {args.steps} steps: {total:.0f} physics steps balanced, "
          f"{envs.episodes} episodes ended")


if __name__ == "__main__":
    main()
