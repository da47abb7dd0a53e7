"""DEAP: a genetic algorithm (`algorithms.eaSimple`) with ``toolbox.register("map", pool.map)``.

The user's program: ``import multiprocessing as mp`` (or ``import fiberexec.multiprocessing
as mp``), then ``with mp.Pool(2) as pool: toolbox.register("map", pool.map)``. eaSimple maps
each generation's changed individuals (about 60 of 80) at once. The `creator` classes are
made at import, as DEAP's documentation asks, so a worker that imports this module to find
`evaluate` can unpickle the individuals too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from types import ModuleType

from deap import algorithms, base, creator, tools

from benchmarks.programs import WORKERS, Outcome, model

KIND = "pool"
POPULATION = 80
GENERATIONS = {"full": 70, "quick": 22}

if not hasattr(creator, "Individual"):
    creator.create("FitnessMin", base.Fitness, weights=(-1.0,))
    creator.create("Individual", list, fitness=creator.FitnessMin)


def evaluate(individual: Sequence[float]) -> tuple[float]:
    return (model.misfit(individual),)


def _toolbox() -> base.Toolbox:
    toolbox = base.Toolbox()
    toolbox.register("gene", random.uniform, model.LOWER, model.UPPER)
    toolbox.register("individual", tools.initRepeat, creator.Individual, toolbox.gene,
                     model.DIM)
    toolbox.register("population", tools.initRepeat, list, toolbox.individual)
    toolbox.register("evaluate", evaluate)
    toolbox.register("mate", tools.cxSimulatedBinaryBounded, eta=15.0, low=model.LOWER,
                     up=model.UPPER)
    toolbox.register("mutate", tools.mutPolynomialBounded, eta=20.0, low=model.LOWER,
                     up=model.UPPER, indpb=1.0 / model.DIM)
    toolbox.register("select", tools.selTournament, tournsize=3)
    return toolbox


def run(mp: ModuleType, size: str) -> Outcome:
    random.seed(0)
    toolbox = _toolbox()
    population = toolbox.population(n=POPULATION)
    start = time.perf_counter()
    with mp.Pool(WORKERS) as pool:
        toolbox.register("map", pool.map)
        population, log = algorithms.eaSimple(population, toolbox, cxpb=0.6, mutpb=0.3,
                                              ngen=GENERATIONS[size], verbose=False)
        seconds = time.perf_counter() - start
    best = tools.selBest(population, 1)[0]
    return {"seconds": seconds, "evaluations": int(sum(log.select("nevals"))),
            "found": [round(v, 3) for v in best], "best": float(best.fitness.values[0])}
