"""Evolution strategies (OpenAI-ES) on a small control task: steer a 2-D point mass to a goal.

Each generation evaluates a population of perturbed policies in parallel; a task receives the
policy, a noise seed and sigma, and rebuilds its perturbation from the seed (so only a few
numbers travel per task, as in Salimans et al., 2017). The environment is a few lines of numpy:
no gym, no download.

    python examples/evolution_strategies.py                 # 30 generations x 64 rollouts
    python examples/evolution_strategies.py --small         # what the tests run
    FIBEREXEC_BACKEND=kubernetes FIBEREXEC_IMAGE=me/es:1 python examples/evolution_strategies.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fiberexec import FiberExecutor

OBS, ACT = 6, 2  # observation: position, velocity, goal; action: force
DT, DRAG, MAX_FORCE = 0.1, 0.1, 1.0


def rollout(theta: np.ndarray, seed: int, steps: int = 100) -> float:
    """Return of one episode: the negative distance to the goal, summed over time."""
    rng = np.random.default_rng(seed)
    pos, vel = rng.uniform(-1, 1, 2), np.zeros(2)
    goal = rng.uniform(-1, 1, 2)
    weights = theta[: OBS * ACT].reshape(ACT, OBS)
    bias = theta[OBS * ACT:]
    total = 0.0
    for _ in range(steps):
        force = np.clip(weights @ np.concatenate([pos, vel, goal]) + bias, -MAX_FORCE, MAX_FORCE)
        vel = (1 - DRAG) * vel + DT * force
        pos = pos + DT * vel
        total -= float(np.linalg.norm(pos - goal))
    return total


def evaluate(
    theta: np.ndarray, noise_seed: int, sigma: float, episodes: int
) -> tuple[float, float]:
    """Returns of ``theta + sigma * eps`` and ``theta - sigma * eps`` (antithetic pair)."""
    eps = np.random.default_rng(noise_seed).standard_normal(theta.size)
    plus = np.mean([rollout(theta + sigma * eps, noise_seed * 1000 + e) for e in range(episodes)])
    minus = np.mean([rollout(theta - sigma * eps, noise_seed * 1000 + e) for e in range(episodes)])
    return float(plus), float(minus)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(x.size)
    ranks[x.ravel().argsort()] = np.arange(x.size)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


def train(ex: FiberExecutor, generations: int, pairs: int, episodes: int) -> list[float]:
    theta = np.zeros(OBS * ACT + ACT)
    sigma, lr = 0.1, 0.05
    history = []
    for gen in range(generations):
        seeds = [gen * pairs + i for i in range(pairs)]
        returns = np.array(list(ex.map(evaluate, [theta] * pairs, seeds, [sigma] * pairs,
                                       [episodes] * pairs)))
        weights = centered_ranks(returns)
        step = sum((w[0] - w[1]) * np.random.default_rng(s).standard_normal(theta.size)
                   for w, s in zip(weights, seeds, strict=True))
        theta = theta + lr / (2 * pairs * sigma) * step
        history.append(float(np.mean([rollout(theta, 10**6 + k) for k in range(8)])))
        print(f"generation {gen:3d}  mean return {returns.mean():8.2f}  "
              f"policy return {history[-1]:8.2f}")
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=32, help="antithetic pairs per generation")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--small", action="store_true", help="a quick run")
    args = parser.parse_args()
    if args.small:
        args.generations, args.pairs, args.episodes = 5, 8, 1
    start = time.perf_counter()
    with FiberExecutor(args.workers) as ex:
        history = train(ex, args.generations, args.pairs, args.episodes)
        stats = ex.stats()
    print(f"return {history[0]:.2f} -> {history[-1]:.2f} in {args.generations} generations, "
          f"{stats.tasks_done} tasks, {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
