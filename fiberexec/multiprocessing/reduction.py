"""``multiprocessing.reduction`` for ``fiberexec.multiprocessing``: the stdlib's own.

Reducers registered with `register` apply where the stdlib pickles, and where we pickle
for our processes, pipes and queues (our pickler takes the stdlib's table first).
``send_handle``/``recv_handle`` need a socket under the connection: a stdlib one.
"""

from __future__ import annotations

from multiprocessing.reduction import (
    DupFd,
    ForkingPickler,
    dump,
    recv_handle,
    recvfds,
    register,
    send_handle,
    sendfds,
)

from fiberexec.multiprocessing import _stdnames

__all__ = ["DupFd", "ForkingPickler", "dump", "recv_handle", "recvfds", "register",
           "send_handle", "sendfds"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
