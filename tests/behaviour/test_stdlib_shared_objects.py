"""Stdlib multiprocessing objects given to workers, as `ProcessPoolExecutor` takes them:
a ``Queue`` and ``Value`` in ``initargs`` (the logging cookbook's ``QueueHandler`` queue),
and a ``Connection`` as a task's argument. Each test runs over both executors.

They reach workers that can see this process (its pid namespace) and its /dev/shm; elsewhere
(a container, another host) the executor says so instead."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from concurrent.futures import BrokenExecutor
from multiprocessing import resource_tracker, shared_memory

import pytest

from tests import tasks
from tests.behaviour.both import SPAWN, Make, make, sees_us
from tests.conftest import ExecutorFactory

__all__ = ["make"]

def test_a_stdlib_queue_and_value_in_initargs_reach_the_workers(
        make: Make, make_executor: ExecutorFactory) -> None:
    queue, counter = SPAWN.Queue(), SPAWN.Value("i", 0)
    ex = make(1, initializer=tasks.remember_shared, initargs=(queue, counter))
    if make is make_executor and not sees_us(make_executor):
        with pytest.raises(BrokenExecutor) as broken:
            ex.submit(tasks.report_and_count, 0).result(timeout=60)
        assert "cannot see" in str(broken.value.__cause__)
        return
    assert list(ex.map(tasks.report_and_count, range(5), timeout=60)) == list(range(5))
    got = sorted(queue.get(timeout=30) for _ in range(6))
    assert got == [("init", 0)] + [("task", x) for x in range(5)]
    assert counter.value == 5
    ex.shutdown()
    queue.close()
    queue.join_thread()


def test_a_stdlib_lock_of_the_fork_start_method_is_refused_with_the_stdlib_error(
        make: Make) -> None:
    lock = multiprocessing.get_context("fork").Lock()
    ex = make(1, initializer=tasks.identity, initargs=(lock,))
    with pytest.raises(Exception, match="fork context"):
        ex.submit(tasks.square, 2).result(timeout=60)


def test_a_refused_fork_lock_is_named_with_where_to_make_one_workers_open(
        make_executor: ExecutorFactory) -> None:
    """tqdm's process_map hands its default-context lock over as initargs: the error says
    which argument it is, and how to make a lock that workers can open."""
    lock = multiprocessing.get_context("fork").RLock()
    refused = pytest.raises(Exception, match=r"initargs: RuntimeError: A SemLock created in a "
                            r"fork context.*made for forked children.*fiberexec\.multiprocessing")
    with refused, make_executor(1, initializer=tasks.identity, initargs=(lock,)) as ex:
        ex.submit(tasks.square, 2).result(timeout=60)


def test_a_stdlib_connection_as_a_task_argument_is_the_same_pipe_there(
        make: Make, make_executor: ExecutorFactory) -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    ex = make(1)
    future = ex.submit(tasks.send_on, writer, ("hello", os.getpid()))
    if make is make_executor and not sees_us(make_executor):
        # handed over as the stdlib does (`multiprocessing.resource_sharer`, a Unix socket
        # in this host's temporary directory): a container may not reach it, and says so
        try:
            sent = future.result(timeout=60)
        except pickle.UnpicklingError as exc:
            assert "cannot unpickle" in str(exc)
            return
    else:
        sent = future.result(timeout=60)
    assert sent == "sent"
    assert reader.poll(30)
    assert reader.recv() == ("hello", os.getpid())
    reader.close()
    writer.close()


def test_a_segment_workers_attached_outlives_them(
        make: Make, make_executor: ExecutorFactory) -> None:
    """An ES noise table in shared memory, attached by name in the workers' initializer, by
    one executor and then another. On Python < 3.13 attaching registers the segment with
    the attaching process's resource tracker, which unlinks it when that process ends: the
    stdlib's workers share this process's tracker, and ours register nothing there."""
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        shm.buf[:4] = bytes([7, 8, 9, 10])
        ours = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
        for _ in range(2):  # the second executor's workers still find it
            with make(2, initializer=tasks.attach_segment, initargs=(shm.name,)) as ex:
                try:
                    got = list(ex.map(tasks.segment_byte_and_tracker, range(4), timeout=60))
                except BrokenExecutor as broken:  # workers with a /dev/shm of their own
                    assert make is make_executor and not sees_us(make_executor)
                    assert "FileNotFoundError" in repr(broken.__cause__), broken
                    return
            assert [byte for byte, _ in got] == [7, 8, 9, 10]
            assert {tracker for _, tracker in got} <= {None, ours}, "a tracker of their own"
        shared_memory.SharedMemory(name=shm.name).close()  # still there
    finally:
        shm.close()
        shm.unlink()
