"""``multiprocessing.connection`` for ``fiberexec.multiprocessing``: the same names.

`Pipe` and `Connection` are ours. `wait` is the stdlib's: it works on our pipe ends, queue
readers and process sentinels, which have descriptors readable exactly when ready.
`Listener` and `Client` are the stdlib's sockets (with its HMAC challenge), which work
between any processes that can reach each other.
"""

from __future__ import annotations

from multiprocessing.connection import Client, Listener, wait

from fiberexec.multiprocessing import _stdnames
from fiberexec.multiprocessing._connection import Connection, Pipe

__all__ = ["Client", "Connection", "Listener", "Pipe", "wait"]

__getattr__ = _stdnames.fallback(__name__)  # the stdlib's other names
