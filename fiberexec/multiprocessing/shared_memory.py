"""``multiprocessing.shared_memory`` for ``fiberexec.multiprocessing``: the stdlib's classes.

A segment created here can be attached by our processes on the same host (pickle the
`SharedMemory`, or pass its name); they do not unlink it when they exit.
"""

from __future__ import annotations

from multiprocessing.shared_memory import ShareableList, SharedMemory

from fiberexec.multiprocessing import _stdnames

__all__ = ["ShareableList", "SharedMemory"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
