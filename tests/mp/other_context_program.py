"""A program that sets a start method for itself, then hands a library the standard library's
own ``spawn`` and ``forkserver`` contexts, as libraries that pick their own do (dynesty's
``dynesty.pool.Pool`` uses ``get_context("spawn")``, and the stdlib's
``ProcessPoolExecutor(max_tasks_per_child=...)`` does without a context): ``python -m
tests.mp.other_context_program forkserver|fiber``. Each child the standard library spawns
takes the parent's start method with it, as `multiprocessing.spawn` passes it down, and
reports it."""

import concurrent.futures
import multiprocessing
import sys

import fiberexec  # noqa: F401  (registers the "fiber" start method)


def start_method(_=None):
    return multiprocessing.get_start_method()


def main():
    multiprocessing.set_start_method(sys.argv[1])
    for name in ("spawn", "forkserver"):
        ctx = multiprocessing.get_context(name)
        with ctx.Pool(2) as pool:
            print(name, "pool:", pool.map(abs, range(-3, 0)), pool.apply(start_method))
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as executor:
            print(name, "executor:", executor.submit(start_method).result())
        process = ctx.Process(target=start_method)
        process.start()
        process.join(60)
        print(name, "process exit code:", process.exitcode)
    # without a context, the stdlib's executor picks "spawn" for max_tasks_per_child
    with concurrent.futures.ProcessPoolExecutor(1, max_tasks_per_child=1) as executor:
        print("max_tasks_per_child:", list(executor.map(abs, (-1, -2))))


if __name__ == "__main__":
    main()
