"""Large arguments sent once per worker: the executor's mirror and the worker's store agree,
through real frames, and nothing stale or shared is ever served."""

from __future__ import annotations

import errno
import hashlib
import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiberexec import ProtocolError, _argcache
from fiberexec import _protocol as p
from fiberexec._argcache import Mirror, Store, Tally
from fiberexec._serialize import Payload

SIZE = 64  # bytes per test buffer; the mirror's threshold is set below it


def _frame(tasks: list[list[bytearray]]) -> p.Tasks:
    """A Tasks message whose tasks carry these buffers out of band."""
    made = []
    for task_id, buffers in enumerate(tasks):
        views = [memoryview(b) for b in buffers]
        made.append(p.Task(task_id, 0, Payload(b"args", views)))
    return p.Tasks([Payload(b"fn")], made)


# A step: either a frame of tasks (each a list of indices into the contents) or an in-place
# change of one content between frames.
steps = st.lists(
    st.one_of(
        st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
        st.integers(0, 4).map(lambda i: ("change", i)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(0, 6))
def test_mirror_and_store_agree_and_serve_what_was_sent(steps: list, room: int) -> None:
    contents = [bytearray([i]) * SIZE for i in range(5)]
    tally = Tally()
    mirror = Mirror(room * SIZE, tally, threshold=SIZE)
    store = Store(room * SIZE)
    sent = 0
    for step in steps:
        if isinstance(step, tuple):
            contents[step[1]][0] ^= 0xFF  # the same object, new content
            continue
        message = _frame([[contents[i] for i in task] for task in step])
        decoded = p.decode(p.encode(message, cache=mirror), store=store)
        assert isinstance(decoded, p.Tasks)
        for task, indices in zip(decoded.tasks, step, strict=True):
            assert [bytes(b) for b in task.args.buffers] == [bytes(contents[i]) for i in indices]
        assert mirror.keys == store.keys
        sent += sum(len(task) for task in step)
    assert tally.kept + tally.saved == (sent * SIZE if room else 0)  # room 0: nothing kept
    assert len(store.keys) <= room


def test_a_repeated_buffer_travels_once_then_as_its_key() -> None:
    theta = bytearray(b"t") * 4096
    mirror, store = Mirror(1 << 20, threshold=1024), Store(1 << 20)
    first = p.encode(_frame([[theta], [theta]]), cache=mirror)
    again = p.encode(_frame([[theta]]), cache=mirror)
    assert len(first) < 4096 + 200 and len(again) < 200  # one copy in the first frame, then a key
    for frame in (first, again):
        decoded = p.decode(frame, store=store)
        assert isinstance(decoded, p.Tasks)
        assert all(bytes(t.args.buffers[0]) == bytes(theta) for t in decoded.tasks)
    assert mirror.tally.kept == 4096 and mirror.tally.saved == 2 * 4096


def test_each_task_gets_its_own_writable_copy() -> None:
    store = Store(1 << 20)
    kept = store.keep(b"k" * 32, memoryview(bytearray(b"abc")))
    kept[0] = ord("X")  # the task changes its argument in place
    again = store.take(b"k" * 32)
    assert again is not None and bytes(again) == b"abc" and not again.readonly


def test_copies_taken_are_private_and_outlive_their_entry() -> None:
    store = Store(8)
    key = b"k" * 32
    store.keep(key, memoryview(bytearray(b"abcd")))
    first, second = store.take(key), store.take(key)
    assert first is not None and second is not None
    first[0] = ord("X")  # one task writes its copy (a private mapping where memory files exist)
    assert bytes(second) == b"abcd" and bytes(store.take(key) or b"") == b"abcd"
    store.next_task()
    store.keep(b"o" * 32, memoryview(bytearray(b"wxyz1")))  # no room for both: "k" goes
    assert store.take(key) is None
    assert bytes(first) == b"Xbcd" and bytes(second) == b"abcd"  # tasks' copies live on


def test_without_memory_files_a_kept_buffer_is_copied_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", refuse)
    store = Store(1 << 20)
    given = store.keep(b"k" * 32, memoryview(bytearray(b"abcd")))
    given[0] = ord("X")  # the first task changes its copy in place
    again = store.take(b"k" * 32)
    assert again is not None and bytes(again) == b"abcd" and not again.readonly


def test_entries_no_recent_task_used_are_evicted_when_another_is_kept() -> None:
    mirror = Mirror(1 << 30, threshold=1)
    mirror.next_task()
    mirror.note(b"a" * 32, 10)
    for _ in range(20):  # many tasks without "a"
        mirror.next_task()
    mirror.note(b"b" * 32, 10)
    assert mirror.keys == [b"b" * 32]


def test_a_reference_to_what_the_peer_does_not_hold_is_a_protocol_error() -> None:
    theta = bytearray(4096)
    mirror = Mirror(1 << 20, threshold=1024)
    p.encode(_frame([[theta]]), cache=mirror)
    frame = p.encode(_frame([[theta]]), cache=mirror)  # a reference only
    with pytest.raises(ProtocolError, match="not held here"):
        p.decode(frame, store=Store(1 << 20))
    with pytest.raises(ProtocolError, match="keeps none"):
        p.decode(frame)


def test_numpy_arrays_round_trip_through_the_cache() -> None:
    np = pytest.importorskip("numpy")
    theta = np.arange(1 << 18, dtype=np.float64)  # 2 MiB
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(((theta,), {}), protocol=5, buffer_callback=buffers.append)
    task = p.Task(1, 0, Payload(data, [b.raw() for b in buffers]))
    mirror, store = Mirror(1 << 30), Store(1 << 30)
    for _ in range(2):
        decoded = p.decode(p.encode(p.Tasks([Payload(b"fn")], [task]), cache=mirror),
                           store=store)
        assert isinstance(decoded, p.Tasks)
        args = decoded.tasks[0].args
        (got,), _ = pickle.loads(args.data, buffers=args.buffers)
        assert np.array_equal(got, theta) and got.flags.writeable
    assert mirror.tally.saved == theta.nbytes


def test_a_buffer_changed_in_place_gets_a_new_key_and_an_equal_one_the_same() -> None:
    """Digests are served from a kept copy only when the content equals it byte for byte;
    a copy is kept once a size's content repeats, and dropped when it changes."""
    recent = _argcache._Recent(budget=8 << 20)
    buffer = bytearray(b"\1" * (2 << 20))
    first = recent.digest(memoryview(buffer))
    assert first == hashlib.sha256(buffer).digest()
    assert 2 << 20 not in recent._copies  # seen once: no copy
    assert recent.digest(memoryview(buffer)) == first
    assert recent._copies[2 << 20] == buffer  # seen twice: a copy to compare with
    assert recent.digest(memoryview(buffer)) == first  # unchanged: from the copy
    buffer[-1] = 2  # changed in place, at its last byte
    changed = recent.digest(memoryview(buffer))
    assert changed == hashlib.sha256(buffer).digest() != first
    assert 2 << 20 not in recent._copies  # other content: the copy went
    assert recent.digest(memoryview(bytearray(b"\1" * (2 << 20)))) == first  # equal content
    for size in (3 << 20, 6 << 20):  # more than the budget holds: the oldest copy goes
        for _ in range(2):
            assert recent.digest(memoryview(bytes(size))) == hashlib.sha256(bytes(size)).digest()
    assert set(recent._copies) == {6 << 20}


def test_buffers_never_sent_twice_are_hashed_and_not_copied() -> None:
    recent = _argcache._Recent(budget=8 << 20)
    for i in range(5):
        buffer = bytes([i]) * (2 << 20)
        assert recent.digest(memoryview(buffer)) == hashlib.sha256(buffer).digest()
    assert not recent._copies
