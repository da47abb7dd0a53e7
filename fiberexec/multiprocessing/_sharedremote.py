"""Shared values seen from a host that cannot map the creator's memory.

Every read and write is a round trip to the creating process's broker, which holds the
memory; the results are the same as a local mapping's, one access at a time. An element or
a contiguous slice is written in one call; anything else is read, changed and written back.
"""

from __future__ import annotations

import ctypes
from typing import Any

from fiberexec.multiprocessing import _calls as calls
from fiberexec.multiprocessing._rpc import Endpoint


class _Remote:
    def __init__(self, type_: Any, name: str, endpoint: Endpoint) -> None:
        self._fx: tuple[Any, str, Endpoint] = (type_, name, endpoint)

    def __reduce__(self) -> tuple[Any, ...]:
        from fiberexec.multiprocessing._sharedctypes import _type_key, remote_by_key

        type_, name, endpoint = self._fx
        return (remote_by_key, (*_type_key(type_), name, endpoint.address, endpoint.secret))

    def _read(self, offset: int = 0, size: int | None = None) -> bytes:
        type_, name, endpoint = self._fx
        size = ctypes.sizeof(type_) if size is None else size
        return endpoint.call(calls.ReadBuffer(name, offset, size))[1]

    def _write(self, data: bytes, offset: int = 0) -> None:
        _, name, endpoint = self._fx
        endpoint.call(calls.WriteBuffer(name, offset), data)

    def _copy(self) -> Any:
        """A private ctypes copy of the whole object."""
        return self._fx[0].from_buffer_copy(self._read())

    def __repr__(self) -> str:
        return f"<remote {self._fx[0].__name__} {self._fx[1]}>"


class RemoteValue(_Remote):
    """A shared simple value (``c_int``, ``c_double`` ...) held by another host."""

    @property
    def value(self) -> Any:
        return self._copy().value

    @value.setter
    def value(self, value: Any) -> None:
        self._write(bytes(self._fx[0](value)))


class RemoteArray(_Remote):
    """A shared ctypes array held by another host: ``len``, items, slices, ``value``/``raw``."""

    _fx_remote_array = True

    @property
    def _type_(self) -> Any:
        return self._fx[0]._type_

    @property
    def _length_(self) -> int:
        return int(self._fx[0]._length_)

    def __len__(self) -> int:
        return self._length_

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            index = range(self._length_)[key]  # IndexError as a list would
            elem = self._type_
            size = ctypes.sizeof(elem)
            return (elem * 1).from_buffer_copy(self._read(index * size, size))[0]
        return self._copy()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        size = ctypes.sizeof(self._type_)
        if isinstance(key, int):
            index = range(self._length_)[key]
            one = (self._type_ * 1)()
            one[0] = value
            self._write(bytes(one), index * size)
            return
        start, stop, step = key.indices(self._length_)
        if step == 1 and stop >= start:
            part = (self._type_ * (stop - start))()
            part[:] = value
            self._write(bytes(part), start * size)
            return
        whole = self._copy()
        whole[key] = value
        self._write(bytes(whole))

    def __iter__(self) -> Any:
        return iter(self._copy())

    @property
    def value(self) -> Any:
        return self._copy().value

    @value.setter
    def value(self, value: Any) -> None:
        whole = self._copy()
        whole.value = value
        self._write(bytes(whole))

    @property
    def raw(self) -> bytes:
        return self._read()

    @raw.setter
    def raw(self, value: bytes) -> None:
        whole = self._copy()
        whole.raw = value
        self._write(bytes(whole))
