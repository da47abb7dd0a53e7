"""Large numpy arguments of a joblib call reach same-host workers as one shared memory map.

joblib's process backends do this (``max_nbytes``, ``mmap_mode``, ``temp_folder``): an array
of at least ``max_nbytes`` is written once to a file in a temporary folder (``/dev/shm`` when
it exists), and every task that gets it opens that file as a read-only `numpy.memmap`, so
workers share one copy in the page cache instead of each unpickling its own.

    FiberBackend.submit(batch) --ArrayStore.pack--> found large arrays? --no--> as it is
        --yes--> cloudpickle with arrays reduced to (file, dtype, shape) -> run_packed(bytes)
    worker: run_packed -> unpickle (each file opened once per worker, `open_map`) -> batch()

Arrays are looked for where joblib users pass them: in a task's arguments and keyword
arguments, and inside the lists, tuples, sets and dicts among them (not inside other
objects: a DataFrame's columns travel as they are). Each array is written once per call,
however many tasks get it. Only for workers on this host (`Backend.workers_share_host`):
elsewhere the folder is not theirs.

An array that already maps a file (a `numpy.memmap`, ``joblib.load(..., mmap_mode=...)``,
or a view of one), whatever its size, travels as that file, the offset and layout of its
data and the map's mode (``"w+"`` opens as ``"r+"``): a task writing into it writes into
the file the caller maps, joblib's documented way to collect results in shared memory.

The folder is removed when the call ends; a program killed before that leaves it to joblib's
resource tracker, which removes it once the program is gone, as it does for loky's. Within a
call, a file goes as soon as its array is gone and every batch that carried it is done (an
array made for each task, ``X[idx]``, would otherwise fill ``/dev/shm`` in a long call).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import pickle
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from fiberexec._inherit import Pickler

MODES = frozenset({"r", "r+", "w+", "c"})
SEARCH_DEPTH = 3  # containers within containers looked into for arrays
_opened: weakref.WeakValueDictionary[tuple[str, str], Any] = weakref.WeakValueDictionary()
_opened_lock = threading.Lock()


def open_map(path: str, mode: str) -> Any:
    """An array's file as a memory map; a worker opens each file once while it is in use."""
    import numpy as np

    with _opened_lock:
        array = _opened.get((path, mode))
        if array is None:
            array = np.load(path, mmap_mode=mode)  # type: ignore[arg-type]  # one of MODES
            _opened[(path, mode)] = array
    return array


def open_file_view(  # noqa: PLR0917  # a pickle's reconstructor takes them positionally
        path: str, mode: str, dtype: Any, shape: tuple[int, ...],
        strides: tuple[int, ...], offset: int) -> Any:
    """A view of ``path``'s bytes from ``offset`` as an array (the file is mapped once per
    worker and mode while in use), for an argument that mapped that file (`file_backed`)."""
    import numpy as np

    with _opened_lock:
        raw = _opened.get((path, "raw " + mode))
        if raw is None:
            raw = np.memmap(path, dtype=np.uint8, mode=mode)  # type: ignore[call-overload]
            _opened[(path, "raw " + mode)] = raw
    view = np.ndarray(shape, dtype, buffer=raw, offset=offset, strides=strides)
    view.flags.writeable = mode != "r"
    return view


def file_backed(array: Any) -> tuple[str, str, int] | None:
    """(file, mode, offset of the array's first byte in it) if ``array`` is a view of a file
    `numpy.memmap` maps; else None."""
    numpy = _numpy()
    filename = getattr(array, "filename", None)
    if (numpy is None or not isinstance(array, numpy.memmap) or not filename
            or getattr(array, "_mmap", None) is None):
        return None
    root = array
    while isinstance(root.base, numpy.ndarray):  # up to the memmap that made the mapping
        root = root.base
    if not isinstance(root, numpy.memmap) or root.offset is None:
        return None
    start = (array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
             + root.offset)
    mode = {"w+": "r+", "readwrite": "r+", "write": "r+", "readonly": "r",
            "copyonwrite": "c"}.get(array.mode, array.mode)
    return str(filename), mode, start


def run_packed(payload: bytes) -> Any:
    """Unpickle a batch packed by `ArrayStore.pack` and run it (in a worker)."""
    batch: Callable[[], Any] = pickle.loads(payload)
    return batch()


class ArrayStore:
    """The temporary folder of one joblib call's large arrays; `close` removes it.

    Args:
        max_nbytes: arrays of this many bytes or more are memory-mapped; None: none are.
        mmap_mode: how workers open them (``"r"``, ``"r+"``, ``"c"``; ``"w+"`` means
            ``"r+"`` once written); None: no memory mapping.
        temp_folder: where the folder goes (default: ``JOBLIB_TEMP_FOLDER``, else
            ``/dev/shm``, else the system's temporary directory).
    """

    def __init__(self, max_nbytes: int | None, mmap_mode: str | None,
                 temp_folder: str | None = None) -> None:
        if mmap_mode is not None and mmap_mode not in MODES:
            raise ValueError(f"mmap_mode must be one of {sorted(MODES)} or None, "
                             f"got {mmap_mode!r}")
        self.max_nbytes = max_nbytes
        self.mode = "r+" if mmap_mode == "w+" else mmap_mode
        self.temp_folder = temp_folder
        self.folder: str | None = None
        self._files: dict[int, tuple[weakref.ref[Any], str]] = {}  # id(array) -> its file
        self._carried: dict[str, int] = {}  # file -> batches in flight that carry it
        self._orphans: set[str] = set()  # files whose arrays are gone: removed once not carried
        # file names are never reused in a call: an array made for one task (``X[idx]``)
        # and freed leaves its id to the next, but its file is still to be read
        self._names = itertools.count()
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.max_nbytes is not None and self.mode is not None

    def pack(self, batch: Any) -> tuple[bytes, Callable[[], None]] | None:
        """The batch pickled with its large arrays and its arrays that map files as
        references to files, and what to call once the batch is done (its files may go);
        or None when it holds none (then it travels as it is)."""
        if not any((self.active and self._mapped(a)) or file_backed(a) is not None
                   for a in _arrays(_task_arguments(batch))):
            return None
        buffer = io.BytesIO()
        pickler = _MappingPickler(buffer, self)
        pickler.dump(batch)
        carried = frozenset(pickler.carried)
        with self._lock:
            for path in carried:
                self._carried[path] = self._carried.get(path, 0) + 1
        return buffer.getvalue(), lambda: self._done(carried)

    def _done(self, carried: frozenset[str]) -> None:
        """A batch that carried ``carried`` is done: remove the files no array and no batch
        in flight needs any more."""
        with self._lock:
            for path in carried:
                left = self._carried.get(path, 0) - 1
                if left > 0:
                    self._carried[path] = left
                else:
                    self._carried.pop(path, None)
            for key, (ref, path) in list(self._files.items()):
                if ref() is None:
                    del self._files[key]
                    self._orphans.add(path)
            gone = [path for path in self._orphans if path not in self._carried]
            self._orphans.difference_update(gone)
        for path in gone:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _mapped(self, array: Any) -> bool:
        assert self.max_nbytes is not None
        if array.dtype.hasobject:
            return False
        return bool(array.nbytes >= self.max_nbytes)

    def reduce(self, array: Any, carried: set[str]) -> tuple[Any, ...] | None:
        """How the pickler sends ``array``: as its file (a file of this store's is added
        to ``carried``), or (None) as it is."""
        backed = file_backed(array)
        if backed is not None:
            path, mode, offset = backed
            return open_file_view, (path, mode, array.dtype, array.shape, array.strides,
                                    offset)
        if not self.active or not self._mapped(array):
            return None
        path = self._file_for(array)
        carried.add(path)
        return open_map, (path, self.mode)

    def _file_for(self, array: Any) -> str:
        with self._lock:
            known = self._files.get(id(array))
            if known is not None:
                if known[0]() is array:
                    return known[1]
                self._orphans.add(known[1])  # its array is gone; the id is another's now
            if self.folder is None:
                # (the pid names the folder's program, as joblib's own folders do)
                self.folder = tempfile.mkdtemp(prefix=f"fiberexec-joblib-{os.getpid()}-",
                                               dir=self._where())
                _track(self.folder, True)
            path = os.path.join(self.folder, f"{next(self._names)}.npy")
            _write(path, array)
            self._files[id(array)] = (weakref.ref(array), path)
            return path

    def _where(self) -> str | None:
        folder = self.temp_folder or os.environ.get("JOBLIB_TEMP_FOLDER")
        if folder:
            return folder
        return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

    def close(self) -> None:
        """Remove the folder (workers that still map a file keep their view of it)."""
        with self._lock:
            folder, self.folder = self.folder, None
            self._files.clear()
            self._carried.clear()
            self._orphans.clear()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            _track(folder, False)


def _track(folder: str, track: bool) -> None:
    """Have joblib's resource tracker (loky's, which joblib's own backends use for their
    memmap folders) remove ``folder`` if this process is killed before `ArrayStore.close`
    does; or no longer."""
    from joblib.externals.loky.backend import resource_tracker

    try:
        (resource_tracker.register if track else resource_tracker.unregister)(folder, "folder")
    except OSError:  # no tracker could start: the folder goes at close, as before
        pass


class _MappingPickler(Pickler):
    def __init__(self, file: io.BytesIO, store: ArrayStore) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.store = store
        self.carried: set[str] = set()  # the store's files this batch refers to

    def reducer_override(self, obj: Any) -> Any:
        if _is_array(obj):
            reduced = self.store.reduce(obj, self.carried)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def _is_array(obj: Any) -> bool:
    numpy = _numpy()
    return numpy is not None and isinstance(obj, numpy.ndarray)


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")  # no numpy imported: no array can be in the batch


def _write(path: str, array: Any) -> None:
    numpy = _numpy()
    target = numpy.lib.format.open_memmap(path, mode="w+", dtype=array.dtype,
                                          shape=array.shape,
                                          fortran_order=array.flags.f_contiguous
                                          and not array.flags.c_contiguous)
    target[...] = array
    target.flush()
    del target


def _task_arguments(batch: Any) -> Iterable[Any]:
    for item in getattr(batch, "items", ()):
        if isinstance(item, tuple) and len(item) == 3:
            _, args, kwargs = item
            yield from args
            yield from kwargs.values()


def _arrays(values: Iterable[Any], depth: int = SEARCH_DEPTH) -> Iterable[Any]:
    for value in values:
        if _is_array(value):
            yield value
        elif depth and isinstance(value, list | tuple | set | frozenset):
            yield from _arrays(value, depth - 1)
        elif depth and isinstance(value, dict):
            yield from _arrays(value.values(), depth - 1)
