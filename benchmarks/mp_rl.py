"""RL workloads for `benchmarks.mp_bench`, written as their users write them.

* `pipe_vector_env`: a vector environment by hand, as RL codebases do (one `Process` per
  environment, commands and observations over a duplex `Pipe`, the learner sending to all and
  then receiving from all): 4 environments, 2000 steps each, a pure-Python cart-pole.
* `gym_vector_env`: gymnasium's own ``AsyncVectorEnv`` on ``CartPole-v1`` (4 environments,
  observations in shared memory). Its ``context=`` is a start-method name it looks up in the
  standard library's `multiprocessing`: ``"spawn"`` there, ``"fiber"`` for fiberexec (the
  one-line change a user makes, `fiberexec._start_method`).
* `start_join`: start 4 processes that do nothing and join them, in a fresh interpreter (what
  a user waits for before the first step).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

GRAVITY, CART_MASS, POLE_MASS, HALF_POLE, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


def _cart_pole_step(state: list[float], action: int) -> tuple[list[float], bool]:
    x, x_dot, theta, theta_dot = state
    force = FORCE if action else -FORCE
    cos, sin = math.cos(theta), math.sin(theta)
    total = CART_MASS + POLE_MASS
    temp = (force + POLE_MASS * HALF_POLE * theta_dot**2 * sin) / total
    theta_acc = (GRAVITY * sin - cos * temp) / (
        HALF_POLE * (4.0 / 3.0 - POLE_MASS * cos**2 / total))
    x_acc = temp - POLE_MASS * HALF_POLE * theta_acc * cos / total
    state = [x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot,
             theta_dot + TAU * theta_acc]
    return state, abs(state[0]) > 2.4 or abs(state[2]) > 0.21


def env_process(conn: Any, seed: int) -> None:
    """One environment: ("step", action) -> (obs, reward, done); ("close", None) ends it."""
    rng = random.Random(seed)
    state = [rng.uniform(-0.05, 0.05) for _ in range(4)]
    while True:
        command, action = conn.recv()
        if command == "close":
            conn.close()
            return
        state, done = _cart_pole_step(state, action)
        if done:
            state = [rng.uniform(-0.05, 0.05) for _ in range(4)]
        conn.send((state, 1.0, done))


def pipe_vector_env(mp: Any, envs: int, steps: int) -> float:
    """Environment steps per second of ``envs`` `Pipe`/`Process` environments."""
    pipes = [mp.Pipe() for _ in range(envs)]
    procs = [mp.Process(target=env_process, args=(child, i)) for i, (_, child) in enumerate(pipes)]
    for proc in procs:
        proc.start()
    for _, child in pipes:
        child.close()
    ends = [here for here, _ in pipes]
    for end in ends:  # every environment runs: only the steps are timed
        end.send(("step", 0))
    for end in ends:
        end.recv()
    start = time.perf_counter()
    for t in range(steps):
        for end in ends:
            end.send(("step", t & 1))
        for end in ends:
            end.recv()
    rate = envs * steps / (time.perf_counter() - start)
    for end in ends:
        end.send(("close", None))
        end.close()
    for proc in procs:
        proc.join(30)
    return rate


def gym_vector_env(method: str, envs: int, steps: int) -> float:
    """Environment steps per second of gymnasium's ``AsyncVectorEnv`` under the start
    method ``method``."""
    import gymnasium as gym
    import numpy as np

    venv = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * envs, context=method)
    try:
        venv.reset(seed=0)
        actions = np.zeros(envs, dtype=np.int64)
        venv.step(actions)
        start = time.perf_counter()
        for t in range(steps):
            actions[:] = t & 1
            venv.step(actions)
        return envs * steps / (time.perf_counter() - start)
    finally:
        venv.close()


def nothing() -> None:
    pass


def start_join(mp: Any, count: int) -> float:
    """Seconds to start ``count`` processes that return at once and join them all."""
    start = time.perf_counter()
    procs = [mp.Process(target=nothing) for _ in range(count)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    seconds = time.perf_counter() - start
    if any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"exit codes {[proc.exitcode for proc in procs]}")
    return seconds
