"""``multiprocessing.sharedctypes`` for ``fiberexec.multiprocessing``: the same names."""

from __future__ import annotations

from fiberexec.multiprocessing._sharedctypes import (
    Array,
    RawArray,
    RawValue,
    Value,
    copy,
    synchronized,
)

__all__ = ["Array", "RawArray", "RawValue", "Value", "copy", "synchronized"]
