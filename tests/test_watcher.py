"""The worker's watcher reads the link only once a stretch of tasks has run a while.

A task shorter than `WATCH_AFTER` wakes no second thread (that cost a quarter of a round
trip); a longer one has the link read for it, so a ``Revoke`` or a stack request is answered
while it runs. Tested on `Watcher` itself, over a real socket pair, and on `OneShot`, the
kernel timer it arms; and on a real worker, whose tasks that hold the GIL end the stretch.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from fiberexec import worker
from fiberexec._timer import OneShot
from fiberexec.worker import WATCH_AFTER, Watcher


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_one_shot_fires_once_after_its_delay() -> None:
    timer = OneShot()
    try:
        assert not readable(timer.fileno(), 0.0)
        start = time.monotonic()
        timer.arm(0.05)
        assert not readable(timer.fileno(), 0.02)
        assert readable(timer.fileno(), 2.0)
        assert time.monotonic() - start >= 0.045
        timer.drain()
        assert not readable(timer.fileno(), 0.1)  # one shot: it does not fire again
    finally:
        timer.close()


def test_one_shot_disarmed_never_fires() -> None:
    timer = OneShot()
    try:
        timer.arm(0.05)
        timer.disarm()
        assert not readable(timer.fileno(), 0.2)
        timer.arm(0.01)  # and it can be armed again
        assert readable(timer.fileno(), 2.0)
    finally:
        timer.close()


class Link:
    """A socket pair: the executor's end writes, the watcher watches the worker's end."""

    def __init__(self) -> None:
        self.executor, self.worker = socket.socketpair()
        self.worker.setblocking(False)
        self.taken = threading.Event()
        self.reads = 0

    def take_in(self) -> None:
        self.reads += 1
        try:
            self.worker.recv(4096)
        except BlockingIOError:
            return
        self.taken.set()


@pytest.fixture
def link() -> Iterator[Link]:
    pair = Link()
    yield pair
    pair.executor.close()
    pair.worker.close()


def test_a_short_task_wakes_no_reader(link: Link, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tasks of 1 ms against a half-second wait: a loaded machine cannot stretch one past it.
    monkeypatch.setattr(worker, "WATCH_AFTER", 0.5)
    watcher = Watcher(link.worker.fileno, link.take_in)
    link.executor.sendall(b"more work")  # waiting before the task even starts
    for _ in range(20):  # twenty tasks, each over well before WATCH_AFTER
        started = time.monotonic()
        watcher.watch()
        time.sleep(0.001)  # the task runs (and lets other threads run)
        watcher.unwatch()
        assert time.monotonic() - started < 0.5
    assert not link.taken.wait(0.2)
    assert link.reads == 0


def test_a_long_task_has_the_link_read_for_it(link: Link) -> None:
    watcher = Watcher(link.worker.fileno, link.take_in)
    watcher.watch()  # a task starts and runs on
    started = time.monotonic()
    link.executor.sendall(b"revoke")
    assert link.taken.wait(5.0)
    assert time.monotonic() - started >= WATCH_AFTER * 0.9
    link.taken.clear()
    link.executor.sendall(b"dump your stack")  # read while the task still runs
    assert link.taken.wait(5.0)
    watcher.unwatch()  # the task ends: the main thread reads for itself
    time.sleep(0.05)  # let the watcher go back to its timer
    link.taken.clear()
    reads = link.reads
    link.executor.sendall(b"next task")
    assert not link.taken.wait(max(0.2, 20 * WATCH_AFTER))
    assert link.reads == reads


def test_a_stretch_of_short_tasks_is_watched_from_its_start(link: Link) -> None:
    """Tasks back to back do not re-arm the timer: the stretch's first start counts."""
    watcher = Watcher(link.worker.fileno, link.take_in)
    link.executor.sendall(b"revoke")
    started = time.monotonic()
    deadline = started + 5.0
    while not link.taken.is_set() and time.monotonic() < deadline:
        watcher.watch()  # the next task of the stretch starts
        time.sleep(WATCH_AFTER / 5)
    assert link.taken.is_set()
    assert time.monotonic() - started < 1.0
    watcher.unwatch()


class CountingTimer(OneShot):
    """The kernel timer, counting the system calls that set it."""

    calls = 0

    def arm(self, seconds: float) -> None:
        CountingTimer.calls += 1
        super().arm(seconds)

    def disarm(self) -> None:
        CountingTimer.calls += 1
        super().disarm()


def test_quick_tasks_between_waits_set_the_timer_once_per_wait(
        link: Link, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round trip after another: each task is over long before `WATCH_AFTER`, and the
    worker then waits for the executor. The timer one set runs on for the next ones (two
    system calls a task cost a fifth of a quick task's time in the worker), and nothing
    is read for them."""
    monkeypatch.setattr(worker, "OneShot", CountingTimer)
    monkeypatch.setattr(CountingTimer, "calls", 0)
    watcher = Watcher(link.worker.fileno, link.take_in)
    link.executor.sendall(b"the next task")  # waiting throughout: never read by the watcher
    tasks, started = 0, time.monotonic()
    while time.monotonic() - started < 0.3:
        watcher.watch()
        watcher.unwatch(idle=True)  # the task is over: the main thread waits again
        tasks += 1
        time.sleep(0.0002)  # the round trip
    assert tasks > 200
    # one arming per WATCH_AFTER at most, with room for a slow machine's late wake-ups
    assert CountingTimer.calls <= 2 * (0.3 / WATCH_AFTER + 1) < tasks / 2
    assert link.reads == 0


def test_a_stretch_is_watched_from_its_own_start_when_an_earlier_timer_runs(
        link: Link) -> None:
    """The timer left running by an earlier short stretch fires before the next stretch is
    due: the watcher sets it again, and reads only once that stretch has run `WATCH_AFTER`."""
    watcher = Watcher(link.worker.fileno, link.take_in)
    watcher.watch()
    watcher.unwatch(idle=True)  # over at once: its timer runs on
    time.sleep(WATCH_AFTER / 2)
    watcher.watch()  # a task starts, half a wait before that timer fires, and runs on
    started = time.monotonic()
    link.executor.sendall(b"revoke")
    assert link.taken.wait(5.0)
    assert time.monotonic() - started >= WATCH_AFTER * 0.9
    watcher.unwatch()


def test_a_task_that_held_the_gil_disarms_the_timer(link: Link,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Between tasks that keep the CPU (the main thread takes in what came itself), or after
    a stretch that ran a good part of its wait, the timer is disarmed: left running, it
    would wake the watcher in the middle of the next such task, to take the GIL from it."""
    monkeypatch.setattr(worker, "OneShot", CountingTimer)
    monkeypatch.setattr(CountingTimer, "calls", 0)
    watcher = Watcher(link.worker.fileno, link.take_in)
    watcher.watch(0.5)
    watcher.unwatch()  # (not idle: a task that held the GIL ends the stretch)
    assert CountingTimer.calls == 2  # armed, then disarmed
    watcher.watch(0.5)
    time.sleep(0.25)  # half its wait
    watcher.unwatch(idle=True)
    assert CountingTimer.calls == 4
    watcher.watch(0.5)
    watcher.unwatch(idle=True)  # over at once: the timer runs on
    assert CountingTimer.calls == 5
    link.executor.sendall(b"the next task")
    assert not link.taken.wait(0.7)  # it fired, into no stretch: nothing is read
    assert link.reads == 0


def test_without_timerfd_the_watcher_reads_at_once(link: Link,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libc has no timerfd, the timer fires as it is armed: the watcher behaves as it
    did before it waited (it reads while any task runs), and still stops when told."""
    from fiberexec import _timer

    monkeypatch.setattr(_timer, "_LIBC", None)
    timer = OneShot()
    try:
        timer.arm(60.0)
        assert readable(timer.fileno(), 1.0)  # at once, not in a minute
    finally:
        timer.close()
    watcher = Watcher(link.worker.fileno, link.take_in)
    watcher.watch()
    link.executor.sendall(b"revoke")
    assert link.taken.wait(5.0)
    watcher.unwatch()
    time.sleep(0.05)
    link.taken.clear()
    link.executor.sendall(b"next task")
    assert not link.taken.wait(0.2)


@pytest.mark.parametrize("seconds", [0.001, 0.007])
def test_tasks_holding_the_gil_back_to_back_wake_no_second_thread(seconds: float) -> None:
    """A worker running tasks that keep it on the CPU sends each result and reads the next
    task from its main thread: its outbox and watcher threads, which could act only by taking
    the GIL from the running task (a forced switch, a wait of up to the switch interval),
    stay asleep. (They used to wake two to three times a task.) Tasks longer than
    `WATCH_AFTER` too (7 ms: still short enough for the executor to send more to wait
    behind each), as every such task is on a machine with more busy processes than cores:
    the watcher starts only once a task outruns the one before twice.

    A task that another process preempts while it spins never waits of its own accord, and
    counts as one that keeps the CPU; a busy machine can still add wake-ups to a round of
    tasks (a task preempted for longer than twice the one before), so up to five rounds
    are run and the quietest one is judged (a run of the whole suite in parallel
    environments once saw 9, 7 and 7 in three; a full run while the host was slow, 10 to
    14 in all five rounds of 7 ms tasks). The old behaviour woke 80 to 120 times in every
    round: fewer than one wake-up in two tasks in the quietest round tells the two apart with
    room to spare (under two busy loops on this machine's two cores: 19 in 40)."""
    from fiberexec import FiberExecutor
    from tests import tasks

    count, rounds = 40 if seconds < WATCH_AFTER else 30, []
    with FiberExecutor(1, heartbeat=30) as ex:
        # Started, the task module imported, and the start-up's work done (a task
        # preempted by it waits more than it runs, and is treated as one that waits).
        for future in [ex.submit(tasks.spin, seconds) for _ in range(5 * count)]:
            future.result(timeout=60)
        while len(rounds) < 5 and (not rounds or min(rounds) >= count // 4):
            before = ex.submit(tasks.thread_switches).result(timeout=60)
            futures = [ex.submit(tasks.spin, seconds, i) for i in range(count)]
            assert [f.result(timeout=60) for f in futures] == list(range(count))
            rounds.append(ex.submit(tasks.thread_switches).result(timeout=60) - before)
    assert min(rounds) < count // 2, (
        f"the worker's other threads woke {rounds} times in rounds of {count} tasks")


def test_tasks_nothing_is_sent_behind_wake_no_second_thread() -> None:
    """Tasks of tens of milliseconds go to a worker one at a time (nothing is queued behind
    a task that long, or of unknown length): the executor says so with each, and the
    worker's watcher, which could only hear a stack request then, starts after
    `WATCH_ALONE` instead of after `WATCH_AFTER`. (It used to wake twice a task: when
    its timer fired, and to be put back to sleep.)"""
    from fiberexec import FiberExecutor
    from tests import tasks

    count = 20
    with FiberExecutor(1, heartbeat=30) as ex:
        ex.submit(tasks.sleep_return, 0.03).result(timeout=60)  # its length is known now
        before = ex.submit(tasks.thread_switches).result(timeout=60)
        futures = [ex.submit(tasks.sleep_return, 0.03, i) for i in range(count)]
        assert [f.result(timeout=60) for f in futures] == list(range(count))
        woken = ex.submit(tasks.thread_switches).result(timeout=60) - before
    assert woken < count // 4, f"the worker's other threads woke {woken} times in {count} tasks"
