"""A program written for the standard library's `multiprocessing`, its start method named on
the command line: ``python -m tests.mp.start_method_program spawn|fiber``. Under ``fiber``
(after ``import fiberexec``, the only other line a user adds) its processes, pool, queues,
manager and ``ProcessPoolExecutor`` are fiberexec's; its output is the same either way but
for the line saying where the children ran (``test_start_method`` compares them).
"""

import concurrent.futures
import multiprocessing
import os
import sys
import time

import fiberexec  # noqa: F401  (registers the "fiber" start method)


def child(queue, conn, n):
    queue.put((n, multiprocessing.current_process().name))
    conn.send(n * 10)
    conn.close()


def square(x):
    return x * x


def on_fiberexec(_=None):
    return "FIBEREXEC_MP_PROCESS" in os.environ or "FIBEREXEC_WORKER_ID" in os.environ


def leave(code):
    raise SystemExit(code)


def main():
    multiprocessing.set_start_method(sys.argv[1])
    print("start method:", multiprocessing.get_start_method())
    queue = multiprocessing.Queue()
    mine, theirs = multiprocessing.Pipe()
    process = multiprocessing.Process(target=child, args=(queue, theirs, 4), name="env-0")
    process.start()
    print("from the child:", queue.get(timeout=60), mine.recv())
    process.join(60)
    print("exit code:", process.exitcode, "alive:", process.is_alive())
    process.close()
    leaving = multiprocessing.Process(target=leave, args=(3,))
    leaving.start()
    leaving.join(60)
    print("SystemExit(3):", leaving.exitcode)
    sleeper = multiprocessing.Process(target=time.sleep, args=(60,), daemon=True)
    sleeper.start()
    sleeper.terminate()
    sleeper.join(60)
    print("terminated:", sleeper.exitcode)
    with multiprocessing.Pool(2) as pool:
        print("pool:", pool.map(square, range(6)))
        ran_on = pool.apply(on_fiberexec)
    with concurrent.futures.ProcessPoolExecutor(2) as executor:
        print("executor:", list(executor.map(square, range(4))))
    with multiprocessing.Manager() as manager:
        shared = manager.dict(a=1)
        shared["b"] = 2
        print("manager:", sorted(shared.items()))
    print("children left:", multiprocessing.active_children())
    print("on fiberexec:", ran_on)


if __name__ == "__main__":
    main()
