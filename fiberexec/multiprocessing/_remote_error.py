"""`RemoteError`, which derives from the standard library's: its module (the stdlib's
managers, with its pool) takes a new interpreter 15 ms to import, so this class is made on
first use (the package's ``__getattr__``), with the managers that raise it."""

from __future__ import annotations

import multiprocessing.managers as _std_managers

from fiberexec.multiprocessing._errors import ProcessError


class RemoteError(ProcessError, _std_managers.RemoteError):
    """A manager-side error that could not be sent back as itself (its text is kept), or
    one raised making a shared object (as the standard library's managers raise it); also
    the standard library's ``multiprocessing.managers.RemoteError``."""

    def __str__(self) -> str:
        return Exception.__str__(self)
