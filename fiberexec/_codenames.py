"""Code pickled by value keeps the name of its file, so a task's traceback and warnings
show the file, line and source line, as `ProcessPoolExecutor`'s do.

cloudpickle sends a function from ``__main__`` (or a lambda, a closure) by value, and names
its code's file ``<dynamic-code>``; `reduce_code` sends the code that way, with its real
file name next to it, and `named_code` puts the name back where the worker rebuilds it.
A worker whose host has that file (the local backend, a shared filesystem, an image that
holds the script at the same path) then reads the source lines from it through `linecache`.
A name that is no file (``<stdin>``, ``<string>`` for ``python -c``) is kept too: the
standard library's traceback names it, without a source line.
"""

from __future__ import annotations

import types
from typing import Any

import cloudpickle

DYNAMIC = "<dynamic-code>"  # what cloudpickle names every file
_cloudpickle_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def reduce_code(code: types.CodeType) -> tuple[Any, ...]:
    """A pickler's reducer for code objects: cloudpickle's, plus the file name."""
    if code.co_filename == DYNAMIC:
        return _cloudpickle_reduce(code)  # type: ignore[no-any-return]
    return named_code, (code.replace(co_filename=DYNAMIC), code.co_filename)


def named_code(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` with its file name back (where a worker unpickles it)."""
    return code.replace(co_filename=filename)
