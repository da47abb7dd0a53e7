"""`TaskFuture`: a `concurrent.futures.Future` in every way its users and the stdlib's
helpers (`wait`, `as_completed`, asyncio's `wrap_future`) can see, with a lighter condition."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

from fiberexec._future import Prompt, TaskFuture, deferred, deferring

KINDS: dict[str, Callable[[], cf.Future[Any]]] = {"stdlib": cf.Future, "fiberexec": TaskFuture}


def later(delay: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


def test_it_has_the_attributes_of_a_plain_future() -> None:
    # TaskFuture sets Future.__init__'s attributes itself: a Python that adds one fails here
    # (beside them, its own two: who holds it at a worker, and its key there)
    assert set(vars(TaskFuture())) == set(vars(cf.Future())) | {"_holder", "_hold_key"}


def test_it_holds_fewer_objects_the_collector_tracks() -> None:
    def tracked(make: Callable[[], cf.Future[Any]]) -> float:
        gc.collect()
        before = len(gc.get_objects())
        kept = [make() for _ in range(1000)]
        count = (len(gc.get_objects()) - before) / len(kept)
        del kept
        return count

    assert round(tracked(TaskFuture)) == 3 < round(tracked(cf.Future))


@pytest.mark.parametrize("kind", KINDS)
def test_result_waits_for_another_thread(kind: str) -> None:
    future = KINDS[kind]()
    timer = later(0.05, lambda: future.set_result(7))
    assert future.result(timeout=5) == 7
    timer.join()
    with pytest.raises(cf.TimeoutError):
        KINDS[kind]().result(timeout=0.01)


@pytest.mark.parametrize("kind", KINDS)
def test_wait_and_as_completed_see_it_finish(kind: str) -> None:
    futures = [KINDS[kind]() for _ in range(3)]
    timer = later(0.05, lambda: futures[1].set_exception(ValueError("x")))
    done, pending = cf.wait(futures, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert done == {futures[1]} and len(pending) == 2
    timer.join()
    timers = [later(0.05 * (i + 1), lambda f=f: f.set_result(None))  # type: ignore[misc]
              for i, f in enumerate((futures[2], futures[0]))]
    order = list(cf.as_completed(futures, timeout=5))
    assert order == [futures[1], futures[2], futures[0]]
    for timer in timers:
        timer.join()


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_and_callbacks_as_the_stdlib(kind: str) -> None:
    future, seen = KINDS[kind](), list[cf.Future[Any]]()
    future.add_done_callback(seen.append)
    assert future.cancel() and future.cancelled() and seen == [future]
    assert not future.set_running_or_notify_cancel()
    running = KINDS[kind]()
    assert running.set_running_or_notify_cancel() and not running.cancel()


@pytest.mark.parametrize("kind", KINDS)
def test_a_settled_or_cancelled_future_refuses_a_result_as_the_stdlib(kind: str) -> None:
    done, cancelled = KINDS[kind](), KINDS[kind]()
    done.set_result(1)
    assert cancelled.cancel()
    for future, state in ((done, "FINISHED"), (cancelled, "CANCELLED")):
        with pytest.raises(cf.InvalidStateError, match=f"^{state}: <Future at 0x"):
            future.set_result(2)
    assert done.result() == 1 and cancelled.cancelled()


@pytest.mark.parametrize("kind", KINDS)
def test_a_result_wakes_every_thread_waiting_for_it(kind: str) -> None:
    future, got = KINDS[kind](), list[object]()
    waiters = [threading.Thread(target=lambda: got.append(future.result(timeout=10)))
               for _ in range(3)]
    for thread in waiters:
        thread.start()
    later(0.05, lambda: future.set_result("x")).join()
    for thread in waiters:
        thread.join(timeout=10)
    assert got == ["x"] * 3


@pytest.mark.parametrize("kind", KINDS)
def test_done_callbacks_run_in_order_and_at_once_when_done(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    future, seen = KINDS[kind](), list[str]()

    def broken(_: cf.Future[Any]) -> None:
        seen.append("broken")
        raise ValueError("a callback's own error")

    future.add_done_callback(lambda f: seen.append(f"first {f.result()}"))
    future.add_done_callback(broken)  # logged; the ones after it still run
    future.add_done_callback(lambda f: seen.append("third"))
    assert seen == []
    future.set_result(7)
    assert seen == ["first 7", "broken", "third"]
    future.add_done_callback(lambda f: seen.append("late"))  # done: runs now, here
    assert seen[-1] == "late"
    assert "exception calling callback" in caplog.text


def test_on_a_thread_standing_in_for_the_shards_only_prompt_callbacks_run_at_once() -> None:
    """A thread standing in for the shard's (a waiting thread that reads its answer) runs a
    future's callbacks there only when every one is a `Prompt`: none of the user's code.
    Else all of them wait for the shard's thread, in the order they were added."""
    prompt_only, mixed = TaskFuture[int](), TaskFuture[int]()
    seen: list[str] = []
    prompt_only.add_done_callback(Prompt(lambda f: seen.append(f"prompt {f.result()}")))
    mixed.add_done_callback(Prompt(lambda f: seen.append("mixed: prompt")))
    mixed.add_done_callback(lambda f: seen.append("mixed: the user's"))
    deferring()
    try:
        prompt_only.set_result(1)
        mixed.set_result(2)
        assert seen == ["prompt 1"]
    finally:
        run = deferred()
    assert run is not None
    run()  # (the shard's thread)
    assert seen == ["prompt 1", "mixed: prompt", "mixed: the user's"]


@pytest.mark.parametrize("kind", KINDS)
def test_asyncio_awaits_it(kind: str) -> None:
    future = KINDS[kind]()

    async def main() -> Any:
        later(0.02, lambda: future.set_result("ok"))
        return await asyncio.wrap_future(future)

    assert asyncio.run(main()) == "ok"


def test_its_condition_is_reentrant_and_owned_by_one_thread() -> None:
    condition = TaskFuture()._condition
    with condition, condition:  # an RLock, as Future's own
        assert condition._is_owned()  # type: ignore[attr-defined]
    assert not condition._is_owned()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError):
        condition.notify_all()  # not held: the stdlib's rule


def test_repr_as_the_stdlib_futures() -> None:
    ours, theirs = TaskFuture[int](), cf.Future[int]()
    for future in (ours, theirs):
        future.set_running_or_notify_cancel()
    assert repr(ours).replace(hex(id(ours)), "X") == repr(theirs).replace(hex(id(theirs)), "X")
    ours.set_result(3)
    theirs.set_result(3)
    assert repr(ours).replace(hex(id(ours)), "X") == "<Future at X state=finished returned int>"
