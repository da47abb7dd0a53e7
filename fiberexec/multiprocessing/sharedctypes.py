"""``multiprocessing.sharedctypes`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._sharedctypes import (
    Array,
    RawArray,
    RawValue,
    Value,
    copy,
    synchronized,
)
from fiberexec.multiprocessing._synchronized import (
    Synchronized,
    SynchronizedArray,
    SynchronizedString,
)

SynchronizedBase = Synchronized  # (the stdlib's base of the three; ours is Synchronized)

__all__ = ["Array", "RawArray", "RawValue", "Synchronized", "SynchronizedArray",
           "SynchronizedBase", "SynchronizedString", "Value", "copy", "synchronized"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
