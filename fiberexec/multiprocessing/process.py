"""``multiprocessing.process`` for ``fiberexec.multiprocessing``: the same names.

``BaseProcess`` is our `Process` (a subclass overrides ``run`` as with the stdlib's).
"""

from __future__ import annotations

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._process import (
    Process,
    active_children,
    current_process,
    parent_process,
)

BaseProcess = Process

__all__ = ["BaseProcess", "Process", "active_children", "current_process", "parent_process"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
