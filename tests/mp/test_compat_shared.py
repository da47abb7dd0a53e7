"""Shared values, shared memory, managers and processes against `multiprocessing` and ours."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import multiprocessing.connection
import multiprocessing.managers
import multiprocessing.pool
import os
import pickle
import signal
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import fiberexec.multiprocessing as fmp
import fiberexec.multiprocessing.managers
from tests.mp import compat_tasks as t
from tests.mp.compat import mpm
from tests.support.kit import BackendKit

__all__ = ["mpm"]


def _managers(mpm: ModuleType) -> ModuleType:
    ours = fiberexec.multiprocessing.managers
    return multiprocessing.managers if mpm is multiprocessing else ours


def _start(mpm: ModuleType, target: object, *args: object) -> object:
    p = mpm.Process(target=target, args=args)
    p.start()
    return p


def test_values_and_arrays_are_shared_with_children(mpm: ModuleType) -> None:
    v = mpm.Value("d", 1.0)
    raw = mpm.RawArray(ctypes.c_int, [1, 2, 3])
    s = mpm.Array("c", 4)
    assert v.value == 1.0 and raw[:] == [1, 2, 3] and s.value == b""
    p = _start(mpm, t.write_values, v, raw, s)
    p.join(60)
    assert p.exitcode == 0
    assert v.value == 2.5 and raw[:] == [1, 7, 3] and s.value == b"hi" and s.raw == b"hi\0\0"
    arr = mpm.Array("i", 5)
    p = _start(mpm, t.fill_array, arr, 3)
    p.join(60)
    assert arr[:] == [0, 3, 6, 9, 12] and len(arr) == 5


def test_structures_are_shared_with_their_fields_under_the_lock(
        mpm: ModuleType, mp_backend: BackendKit) -> None:
    v = mpm.Value(t.Point, 1.5, 2)
    raw = mpm.RawValue(t.Point, 0.0, 0)
    assert type(v).__name__ == "SynchronizedPoint" and (v.x, v.y) == (1.5, 2)
    p = _start(mpm, t.move_point, v, raw)
    p.join(60)
    if mpm is fmp and not mp_backend.same_host:  # a structure is shared on this host only
        assert p.exitcode == 1 and (v.x, v.y, raw.x) == (1.5, 2, 0.0)
        return
    assert p.exitcode == 0 and (v.x, v.y, raw.x) == (2.5, 7, 9.5)


def test_shared_values_show_their_value(mpm: ModuleType) -> None:
    assert repr(mpm.RawValue("i", 3)) == "c_int(3)"
    assert repr(mpm.Value("d", 1.5)) == "<Synchronized wrapper for c_double(1.5)>"


def test_value_options(mpm: ModuleType) -> None:
    plain = mpm.Value("i", 5, lock=False)
    assert isinstance(plain, ctypes.c_int) and plain.value == 5
    assert isinstance(mpm.RawValue("h", 2), ctypes.c_short)
    lock = mpm.Lock()
    locked = mpm.Value(ctypes.c_double, 0.5, lock=lock)
    assert locked.get_lock() is lock and locked.get_obj().value == 0.5
    default = mpm.Array("d", [1.5, 2.5])
    assert isinstance(default.get_obj(), ctypes.Array)
    with default.get_lock():
        default[0] = 3.0
    assert default[:] == [3.0, 2.5] and default[-1] == 2.5
    with pytest.raises(AttributeError):
        mpm.Value("i", 0, lock=3)
    assert mpm.RawArray("b", 3)[:] == [0, 0, 0]


def test_arrays_are_zero_copy_with_numpy(mpm: ModuleType) -> None:
    arr = mpm.Array("d", 4)
    view = np.frombuffer(arr.get_obj(), dtype=np.float64)
    p = _start(mpm, t.fill_array, arr, 2)
    p.join(60)
    assert view.tolist() == [0.0, 2.0, 4.0, 6.0]  # the child wrote into our memory
    view[0] = -1.0
    assert arr[0] == -1.0


def test_stdlib_shared_memory_attaches_in_children(mpm: ModuleType,
                                                   mp_backend: BackendKit) -> None:
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        p = _start(mpm, t.attach_and_write, shm)
        p.join(60)
        if mpm is fmp and not mp_backend.same_host:  # as the README says: same host only
            assert p.exitcode == 1 and bytes(shm.buf[:5]) == bytes(5)
            return
        assert p.exitcode == 0
        assert bytes(shm.buf[:5]) == b"hello"
        again = shared_memory.SharedMemory(name=shm.name)  # the child did not unlink it
        again.close()
    finally:
        shm.close()
        shm.unlink()


def test_a_segment_pool_tasks_attached_outlives_their_workers(
        mpm: ModuleType, mp_backend: BackendKit) -> None:
    """Each task's worker ends after it (``maxtasksperchild=1``), and the segment it
    attached stays for the next task and the parent (see `attach_without_tracking`)."""
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        shm.buf[0] = 7
        ours = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
        with mpm.Pool(2, maxtasksperchild=1) as pool:
            if mpm is fmp and not mp_backend.same_host:  # as the README says: same host only
                with pytest.raises(FileNotFoundError):
                    pool.map(t.attach_read_tracker, [shm.name] * 4)
                return
            got = pool.map(t.attach_read_tracker, [shm.name] * 4)
        assert [byte for byte, _ in got] == [7] * 4
        assert {tracker for _, tracker in got} <= {None, ours}, "a tracker of their own"
        shared_memory.SharedMemory(name=shm.name).close()  # still there
    finally:
        shm.close()
        shm.unlink()


def test_a_child_unlinks_a_segment_it_attached_without_tracker_errors(
        mpm: ModuleType, mp_backend: BackendKit, capfd: pytest.CaptureFixture[str]) -> None:
    shm = shared_memory.SharedMemory(create=True, size=16)
    try:
        p = _start(mpm, t.attach_and_unlink, shm.name)
        p.join(60)
        if mpm is fmp and not mp_backend.same_host:  # as the README says: same host only
            assert p.exitcode == 1
            return
        assert p.exitcode == 0
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=shm.name)
    finally:
        shm.close()
        if mpm is fmp:  # ours: the parent's tracker still has it (the stdlib's child
            # unregistered it from the tracker they share)
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    assert "Traceback" not in capfd.readouterr().err  # from a resource tracker: KeyError


def test_manager_is_shut_down_when_dropped(mpm: ModuleType) -> None:
    before = set(mpm.active_children())  # (loky's reusable workers, say)

    def use_and_drop() -> None:
        m = mpm.Manager()
        d = m.dict()
        d["a"] = 1
        assert d["a"] == 1

    use_and_drop()
    gc.collect()
    assert set(mpm.active_children()) - before == set()


def test_manager_dropped_while_this_thread_is_inside_the_rpc_layer_shuts_down() -> None:
    """A garbage collection can run a dropped manager's (and its proxies') finalizers at
    any allocation, in whatever thread allocates: also while that thread is inside the
    RPC layer's table of connections, which those finalizers need to call the server."""
    import threading

    from fiberexec.multiprocessing import _rpc

    m = fmp.Manager()
    d = m.dict()
    d["a"] = 1
    held: list[object] = [m, d]
    del m, d
    finished = threading.Event()

    def drop() -> None:
        with _rpc._clients_lock:  # where such a collection may happen
            held.clear()
            gc.collect()
        finished.set()

    threading.Thread(target=drop, daemon=True).start()
    assert finished.wait(60), "the finalizers deadlocked on the connection table"
    assert fmp.active_children() == []


def test_manager_join_and_connect(mpm: ModuleType) -> None:
    managers = _managers(mpm)
    before = set(mpm.active_children())  # (loky's reusable workers, say)
    with mpm.Manager() as m:
        d = m.dict()
        d["x"] = 1
        other = managers.SyncManager(address=m.address,
                                     authkey=bytes(mpm.current_process().authkey))
        other.connect()
        shared = other.list([1])
        shared.append(2)
        assert list(shared) == [1, 2] and d["x"] == 1
    m.join(30)
    assert set(mpm.active_children()) - before == set()


class StdlibMathsManager(multiprocessing.managers.BaseManager):
    """Module level, so a server started by "spawn" or "forkserver" can unpickle it."""


class FiberMathsManager(fiberexec.multiprocessing.managers.BaseManager):
    pass


def test_register_exposed_and_method_to_typeid(mpm: ModuleType) -> None:
    managers = _managers(mpm)
    MyManager = StdlibMathsManager if mpm is multiprocessing else FiberMathsManager
    MyManager.register("Maths", t.Maths, exposed=("add", "child"),
                       method_to_typeid={"child": "Child"})
    MyManager.register("Child", exposed=("add",), create_method=False)
    with MyManager() as m:
        maths = m.Maths()
        assert maths.add(2, 3) == 5
        with pytest.raises(Exception, match="not in exposed"):  # stdlib: its RemoteError
            maths._callmethod("secret")
        child = maths.child()
        assert isinstance(child, managers.BaseProxy) and child.add(1, 1) == 2


class StdlibAutoManager(multiprocessing.managers.BaseManager):
    pass


class FiberAutoManager(fiberexec.multiprocessing.managers.BaseManager):
    pass


def test_a_type_registered_without_a_proxy_type_gets_an_auto_proxy(mpm: ModuleType) -> None:
    """Named ``AutoProxy[typeid]``, with the object's public methods and no other
    attribute; a copy sent to a process (pickled) is the same."""
    MyManager = StdlibAutoManager if mpm is multiprocessing else FiberAutoManager
    MyManager.register("Maths", t.Maths)
    with MyManager() as m:
        maths = m.Maths()
        assert type(maths).__name__ == "AutoProxy[Maths]"
        assert sorted(maths._exposed_) == ["add", "child", "secret"]
        assert {"add", "child", "secret"} <= set(dir(maths))
        with pytest.raises(AttributeError):
            maths.missing  # noqa: B018  # the attribute under test
        copy = pickle.loads(pickle.dumps(maths))
        assert type(copy).__name__ == "AutoProxy[Maths]" and copy.add(2, 3) == 5


def test_list_proxy_operators(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        lst = m.list([1, 2])
        assert lst + [3] == [1, 2, 3]  # noqa: RUF005  # the operator under test
        assert lst * 2 == [1, 2, 1, 2]
        lst += [3]
        assert list(lst) == [1, 2, 3]
        lst *= 2
        assert list(lst) == [1, 2, 3, 1, 2, 3] and len(lst) == 6


def test_proxies_work_in_processes(mpm: ModuleType) -> None:
    with mpm.Manager() as m:
        lst, d, lock, event, ns = m.list(), m.dict(), m.Lock(), m.Event(), m.Namespace()
        value, arr, q = m.Value("i", 0), m.Array("i", [0, 0]), m.Queue()
        sem, cond = m.Semaphore(1), m.Condition()
        p = _start(mpm, t.proxy_work, lst, d, lock, event, ns, value, arr, q, sem, cond)
        assert event.wait(60) and q.get(timeout=60) == "done"
        p.join(60)
        assert p.exitcode == 0
        assert list(lst) == [p.pid] and d["child"] is True and value.value == 1
        assert arr[0] == 9 and ns.x == "set"
        barrier = m.Barrier(1)
        assert barrier.wait(5) == 0


def test_process_authkey_sentinel_and_parent(mpm: ModuleType) -> None:
    q = mpm.Queue()
    p = mpm.Process(target=t.put_authkey, args=(q,))
    assert bytes(p.authkey) == bytes(mpm.current_process().authkey)
    p.start()
    assert q.get(timeout=60) == bytes(p.authkey)
    assert multiprocessing.connection.wait([p.sentinel], timeout=60) == [p.sentinel]
    p.join(60)
    p = _start(mpm, t.put_parent, q, mpm.__name__)
    name, pid, alive = q.get(timeout=60)
    assert (name, pid, alive) == ("MainProcess", os.getpid(), True)
    p.join(60)
    assert mpm.parent_process() is None


@pytest.mark.parametrize("method", ["kill", "terminate"])
def test_signals_give_negative_exit_codes_and_close(mpm: ModuleType, method: str) -> None:
    p = _start(mpm, t.sleep_long)
    assert p.pid is not None and p.is_alive()
    getattr(p, method)()
    p.join(60)
    expected = signal.SIGKILL if method == "kill" else signal.SIGTERM
    assert p.exitcode == -expected
    p.close()
    with pytest.raises(ValueError, match="process object is closed"):
        p.is_alive()
    for closed in ("pid", "ident", "exitcode", "sentinel"):
        with pytest.raises(ValueError, match="process object is closed"):
            getattr(p, closed)


def test_nested_processes(mpm: ModuleType) -> None:
    q = mpm.Queue()
    p = _start(mpm, t.start_grandchild, mpm.__name__, q)
    first = q.get(timeout=60)
    assert first[0].startswith("Process-") and q.get(timeout=60) == ("joined", 0)
    p.join(60)
    assert p.exitcode == 0


def test_pool_errors_have_stdlib_types(mpm: ModuleType) -> None:
    with mpm.Pool(1) as pool:
        with pytest.raises(ValueError, match="invalid literal") as info:
            pool.apply(int, ("x",))
        assert isinstance(info.value.__cause__, multiprocessing.pool.RemoteTraceback)
        assert "invalid literal" in str(info.value.__cause__)
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as unsent:
            pool.apply(t.make_lock)
        # What the pickler raised, and the value it could not pickle, as their reprs
        assert unsent.value.exc.startswith("TypeError(") and "_thread.lock" in unsent.value.exc
        assert unsent.value.value.startswith("<unlocked _thread.lock object at 0x")
        assert str(unsent.value).startswith("Error sending result: '<unlocked _thread.lock")
        # A map's chunk is sent as a list, even of one item; imap sends an item alone
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as unsent:
            pool.map(t.make_lock_for, [1], chunksize=1)
        assert unsent.value.value.startswith("[<unlocked _thread.lock object at 0x")
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as unsent:
            list(pool.imap(t.make_lock_for, [1]))
        assert unsent.value.value.startswith("<unlocked _thread.lock object at 0x")
        assert pool.map(abs, [-1, -2], chunksize=1) == list(pool.imap(abs, [-1, -2])) == [1, 2]


# ---------------------------------------------------------------- fiberexec only, on purpose

def test_primitives_and_values_work_in_pool_tasks() -> None:
    """The standard library refuses to pickle these into Pool tasks; ours travel anywhere."""
    lock, counter = fmp.Lock(), fmp.Value("i", 0)
    with fmp.Pool(2) as pool:
        pool.starmap(t.increment, [(lock, counter, 10)] * 4)
    assert counter.value == 40


def test_values_fall_back_to_the_broker_where_memory_is_not_shared() -> None:
    value, array = fmp.Value("i", 1), fmp.RawArray("i", 4)
    p = fmp.Process(target=t.remote_write, args=(pickle.dumps((value, array)),))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert value.value == 11 and array[:] == [0, 5, 6, 7]


def test_children_run_with_the_stdlib_authkey_for_stdlib_managers(
        mp_backend: BackendKit) -> None:
    backend = mp_backend.make_backend()
    host = backend.advertise_host  # where the children reach this host
    backend.close()
    with multiprocessing.managers.SyncManager(address=(host, 0)) as m:
        d = m.dict()
        p = fmp.Process(target=t.set_item, args=(d,))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and d["from child"] == 1


def test_an_array_dev_shm_cannot_hold_is_shared_from_the_temporary_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As the standard library's heap does when /dev/shm is too small (a container's 64 MiB):
    the file goes to the temporary directory, and children map it there."""
    import tempfile

    from fiberexec import _shm

    monkeypatch.setattr(_shm, "SHM_DIR", str(tmp_path / "none"))  # here: no /dev/shm
    arr = fmp.RawArray("i", 1000)
    mine = [n for n in os.listdir(tempfile.gettempdir())
            if n.startswith(f"fiberexec-mp{os.getpid()}-")]
    assert len(mine) == 1
    p = _start(fmp, t.fill_array, arr, 3)
    p.join(60)
    assert p.exitcode == 0
    assert arr[:4] == [0, 3, 6, 9] and arr[999] == 2997
    del arr
    gc.collect()
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), mine[0]))


def test_an_array_no_file_system_has_room_for_lives_in_this_process() -> None:
    """No room for its file anywhere (writes past 2 MiB refused): the array is this process's
    memory, which children reach through its broker (the stdlib's raises OSError), where a
    file whose pages cannot be had would kill the process (SIGBUS) at its first write."""
    import subprocess
    import sys

    program = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
import fiberexec.multiprocessing as mp
from tests.mp import compat_tasks as t
if __name__ == "__main__":
    arr = mp.RawArray("d", 1 << 19)  # 4 MiB
    arr[0], arr[-1] = 0.25, 1.5
    p = mp.Process(target=t.double_ends, args=(arr,)); p.start(); p.join(120)
    print(p.exitcode, arr[:2], arr[-1])
"""
    done = subprocess.run([sys.executable, "-c", program], text=True, capture_output=True,
                          timeout=180, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "0 [0.5, 0.0] 3.0"


SCRIPT_STRUCTURE = """
import ctypes, sys
mp = __import__(sys.argv[1], fromlist=["Process"])

class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("y", ctypes.c_int)]

    def norm(self):
        return abs(self.x) + abs(self.y)

def child(v, arr, q):
    v.x += 1.0
    arr[1].y = 42
    q.put((type(v.get_obj()).__name__, v.get_obj().norm(), isinstance(arr[0], Point)))

if __name__ == "__main__":
    if sys.argv[1] == "multiprocessing":
        mp.set_start_method("spawn")
    v, arr, q = mp.Value(Point, 1.5, 2), mp.Array(Point, 3), mp.Queue()
    p = mp.Process(target=child, args=(v, arr, q))
    p.start()
    print(q.get(timeout=60))
    p.join(60)
    print(p.exitcode, v.x, arr[1].y)
"""


def test_a_structure_the_script_defines_is_shared_with_a_child(
        mpm: ModuleType, tmp_path: Path) -> None:
    """The script's ctypes class reaches a child (fiberexec: by value, made again there)."""
    import subprocess
    import sys

    script = tmp_path / "structure.py"
    script.write_text(SCRIPT_STRUCTURE)
    done = subprocess.run([sys.executable, str(script), mpm.__name__], check=False,
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["('Point', 4.5, True)", "0 2.5 42"]


KILLED_WITH_SHARED_VALUES = """
import importlib, os, signal, sys
from multiprocessing import resource_tracker
mp = importlib.import_module(sys.argv[1])
value, array = mp.Value("d", 1.0), mp.Array("i", 10)
tracker = resource_tracker._resource_tracker._pid or 0
print(os.getpid(), tracker, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_program_killed_leaves_no_shared_value_behind(mpm: ModuleType) -> None:
    """A program killed with values and arrays alive leaves nothing in /dev/shm: the
    stdlib's are unlinked at once; ours, files others map by name, are removed by the
    stdlib's resource tracker once the program is gone (as a leaked `SharedMemory` is)."""
    import subprocess
    import sys

    from fiberexec.backend import readable_within

    proc = subprocess.run([sys.executable, "-c", KILLED_WITH_SHARED_VALUES, mpm.__name__],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid, tracker = (int(word) for word in proc.stdout.split())
    if tracker:  # it removes what the program left as it ends, which it does now
        try:
            pidfd = os.pidfd_open(tracker)
        except ProcessLookupError:
            pass
        else:
            try:
                assert readable_within(pidfd, 30), "the resource tracker did not end"
            finally:
                os.close(pidfd)
    left = [name for name in os.listdir("/dev/shm")  # (a value's lock is a semaphore there)
            if name.startswith((f"fiberexec-mp{pid}-", f"pym-{pid}-",
                                f"sem.fiberexec-mp{pid}-"))]
    assert not left
