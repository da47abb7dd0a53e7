"""``multiprocessing.util`` for ``fiberexec.multiprocessing``: the stdlib's own.

Its logger, `Finalize` and exit handling are process-wide; our processes run its exit
function (finalizers included) before they exit, as the stdlib's children do.
"""

from __future__ import annotations

from multiprocessing.util import (
    SUBDEBUG,
    SUBWARNING,
    Finalize,
    ForkAwareLocal,
    ForkAwareThreadLock,
    close_all_fds_except,
    debug,
    get_logger,
    get_temp_dir,
    info,
    is_exiting,
    log_to_stderr,
    register_after_fork,
    sub_debug,
    sub_warning,
)

from fiberexec.multiprocessing import _stdnames

__all__ = [
    "SUBDEBUG",
    "SUBWARNING",
    "Finalize",
    "ForkAwareLocal",
    "ForkAwareThreadLock",
    "close_all_fds_except",
    "debug",
    "get_logger",
    "get_temp_dir",
    "info",
    "is_exiting",
    "log_to_stderr",
    "register_after_fork",
    "sub_debug",
    "sub_warning",
]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
