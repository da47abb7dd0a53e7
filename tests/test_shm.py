"""Shared-memory buffers: pooled files are written again only once their receiver let go."""

from __future__ import annotations

import gc
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from fiberexec import _shm

MIB = 1 << 20


@pytest.fixture
def executor_id() -> Iterator[str]:
    eid = secrets.token_hex(4)
    yield eid
    _shm.drop_pool(eid)
    _shm.remove_all(eid)


def _files(eid: str) -> set[str]:
    return {n for n in os.listdir(_shm.SHM_DIR) if n.startswith(f"{_shm.PREFIX}{eid}-")}


def _data(fill: int, size: int = 2 * MIB) -> memoryview:
    return memoryview(bytes([fill]) * size)


def test_a_pooled_file_is_written_again_once_its_receiver_let_go(executor_id: str) -> None:
    first = _shm.write(executor_id, _data(1))
    view = _shm.take(first, 2 * MIB)
    assert _shm.POOL_TAG in first and bytes(view[:3]) == b"\1\1\1"
    second = _shm.write(executor_id, _data(2))
    assert second != first  # the first is still mapped: another file
    assert bytes(view[-3:]) == b"\1\1\1"  # and what the receiver holds is unchanged
    del view
    gc.collect()
    third = _shm.write(executor_id, _data(3))
    assert third == first  # free again: written again, no new pages
    again = _shm.take(third, 2 * MIB)
    assert bytes(again[:2]) + bytes(again[-2:]) == b"\3\3\3\3"
    assert _files(executor_id) == {first, second}


def test_a_buffer_the_receiver_keeps_goes_in_a_file_of_its_own(executor_id: str) -> None:
    name = _shm.write(executor_id, _data(4), keep=True)
    assert _shm.POOL_TAG not in name
    view = _shm.take(name, 2 * MIB)
    assert name not in _files(executor_id)  # unlinked as it was mapped: the mapping is ours
    assert bytes(view[:1]) == b"\4"


def test_when_every_pooled_file_is_busy_a_buffer_gets_a_file_of_its_own(
    executor_id: str,
) -> None:
    held = [_shm.take(_shm.write(executor_id, _data(i)), 2 * MIB)
            for i in range(_shm.POOL_SEGMENTS)]
    extra = _shm.write(executor_id, _data(9))
    assert _shm.POOL_TAG not in extra
    assert [bytes(v[:1]) for v in held] == [bytes([i]) for i in range(_shm.POOL_SEGMENTS)]


def test_a_larger_buffer_does_not_fit_a_smaller_free_file(executor_id: str) -> None:
    small = _shm.write(executor_id, _data(1, MIB))
    view = _shm.take(small, MIB)
    del view
    gc.collect()
    large = _shm.write(executor_id, _data(2, 3 * MIB))
    assert large != small
    assert bytes(_shm.take(large, 3 * MIB)[-1:]) == b"\2"


def test_dropping_the_pool_unlinks_its_files_and_a_mapping_still_reads(
    executor_id: str,
) -> None:
    name = _shm.write(executor_id, _data(5))
    view = _shm.take(name, 2 * MIB)
    _shm.drop_pool(executor_id)
    assert _files(executor_id) == set()
    assert bytes(view[-1:]) == b"\5"
    del view
    gc.collect()  # the receiver's release finds no file: nothing to do, no error


def test_discard_leaves_a_pooled_file_and_removes_a_file_of_its_own(executor_id: str) -> None:
    pooled = _shm.write(executor_id, _data(6))
    own = _shm.write(executor_id, _data(7), keep=True)
    _shm.discard(pooled)
    _shm.discard(own)
    assert _files(executor_id) == {pooled}


def test_remove_all_removes_only_this_executors_files_and_copes_without_dev_shm(
        executor_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _shm.write(executor_id, memoryview(b"x" * 10), keep=True)
    other = _shm.write(f"{executor_id}x", memoryview(b"y" * 10), keep=True)
    try:
        assert _shm.remove_all(executor_id) == 1
        assert not os.path.exists(os.path.join(_shm.SHM_DIR, mine))
        assert os.path.exists(os.path.join(_shm.SHM_DIR, other))
    finally:
        _shm.remove_all(f"{executor_id}x")
    monkeypatch.setattr(_shm, "SHM_DIR", str(tmp_path / "absent"))
    assert _shm.remove_all(executor_id) == 0


# A process whose files may not grow past 2 MiB (RLIMIT_FSIZE; SIGXFSZ ignored, so a write
# past it fails with EFBIG): shared memory has no room for a 4 MiB buffer, as a container's
# small /dev/shm has none, with no privilege needed to set it up.
_NO_ROOM_PRELUDE = """
import logging, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
"""


def _run_without_room(program: str) -> list[str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NO_ROOM_PRELUDE + program], text=True,
                          capture_output=True, timeout=120, check=False,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_a_buffer_shared_memory_has_no_room_for_is_refused_and_leaves_nothing(
        executor_id: str) -> None:
    lines = _run_without_room(f"""
from fiberexec import _shm
big, small = memoryview(b"x" * (4 << 20)), memoryview(b"y" * (512 << 10))
print(_shm.write("{executor_id}", big))  # a pooled file: refused as it is sized
print(_shm.write("{executor_id}", big, keep=True))  # a file of its own: refused mid-write
kept = _shm.write("{executor_id}", small, keep=True)
print(kept is not None and bytes(_shm.take(kept, 512 << 10)[:2]).decode())
print(_shm.write("{executor_id}", small) is not None)  # the pool still serves what fits
""")
    assert lines[-4:] == ["None", "None", "yy", "True"], lines
    warnings = [line for line in lines if line.startswith("LOG")]
    assert len(warnings) == 1 and "no room for a 4.0 MiB buffer" in warnings[0]
    assert "--shm-size" in warnings[0]
    assert all(_shm.POOL_TAG in name for name in _files(executor_id))  # no partial file


def test_arguments_and_results_shared_memory_has_no_room_for_go_inline() -> None:
    lines = _run_without_room("""
import numpy as np
from fiberexec import FiberExecutor, _shm
from tests import tasks
data = np.arange(1 << 19, dtype=np.float64)  # 4 MiB
with FiberExecutor(2) as ex:
    back = ex.submit(tasks.identity, data).result(timeout=60)
    eid = ex._pool.session.executor_id
    print(bool((back == data).all()), back.nbytes)
print([name for name in os.listdir(_shm.SHM_DIR) if eid in name])
""")
    assert lines[-2:] == ["True 4194304", "[]"], lines
    assert sum("no room" in line for line in lines) == 1, lines  # said once, by the executor


def test_a_long_pickle_stream_travels_through_shared_memory_both_ways() -> None:
    """A long list of Python objects (no buffers of its own) moves as a numpy array does:
    its pickle stream goes through /dev/shm as an out-of-band buffer, not in a message (so
    no message's size limits it)."""
    from fiberexec import FiberExecutor
    from tests import tasks

    rows = [f"row {i:07d}" for i in range(200_000)]  # a pickle stream of about 3 MiB
    with FiberExecutor(1, backend="local") as ex:
        ex.submit(tasks.identity, 0).result(timeout=60)
        before = ex.stats()
        assert ex.submit(tasks.identity, rows).result(timeout=60) == rows
        after = ex.stats()
    assert after.bytes_sent - before.bytes_sent < 64 << 10
    assert after.bytes_received - before.bytes_received < 64 << 10


def test_what_a_message_carries_is_checked_against_its_limit() -> None:
    from fiberexec import _protocol as p
    from fiberexec._errors import SerializationError
    from fiberexec._serialize import Payload

    big = memoryview(bytearray(2 * MIB))
    payload = Payload(b"x" * 1000, [big, memoryview(bytearray(100))])
    assert p.check_fits(payload, True, "it") == 1100  # the large buffer goes to /dev/shm
    assert p.check_fits(payload, False, "it") == 1100 + 2 * MIB
    over = Payload(b"", [big] * (p.MAX_PAYLOAD // (2 * MIB) + 1))  # one buffer, many times
    assert p.check_fits(over, True, "it") == 0
    with pytest.raises(SerializationError, match=r"^it pickle to 1\.94 GiB, more than the "
                       r"1\.94 GiB one message may carry between an executor and a worker"):
        p.check_fits(over, False, "it")


def test_a_long_pickle_stream_goes_inline_to_a_worker_without_shared_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same list to a worker that shares no shared memory with the executor (here: the
    executor finds none) travels inside the messages, both ways, and arrives whole."""
    from fiberexec import FiberExecutor
    from tests import tasks

    monkeypatch.setattr(_shm, "SHM_DIR", "/nonexistent-shm")
    rows = [f"row {i:07d}" for i in range(200_000)]
    with FiberExecutor(1, backend="local") as ex:
        assert ex.submit(tasks.identity, rows).result(timeout=60) == rows
        stats = ex.stats()
    assert stats.bytes_sent > 2 * MIB and stats.bytes_received > 2 * MIB
