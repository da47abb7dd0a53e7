"""A program written for `multiprocessing`; only its import line differs.

Run as ``python -m tests.mp.dropin_program [stdlib]`` (the test compares both outputs).
"""

import sys

if sys.argv[-1] == "stdlib":
    import multiprocessing as mp
else:
    import fiberexec as mp  # the one changed line


def square(x):
    return x * x


def producer(q, conn, shared):
    for i in range(3):
        q.put(i)
    q.put(None)
    conn.send("from child")
    conn.close()
    shared.append("child")


def main():
    with mp.Pool(2) as pool:
        print(pool.map(square, range(5)), sorted(pool.imap_unordered(square, range(4))))
    q = mp.Queue()
    parent_conn, child_conn = mp.Pipe()
    with mp.Manager() as manager:
        shared = manager.list()
        p = mp.Process(target=producer, args=(q, child_conn, shared))
        p.start()
        items = []
        while (item := q.get()) is not None:
            items.append(item)
        print(items, parent_conn.recv())
        p.join()
        print(p.exitcode, list(shared), mp.cpu_count() >= 1)


if __name__ == "__main__":
    main()
