"""What runs a chunk of a chunked map inside a worker.

Kept apart from the executor's modules on purpose: a worker imports this on its first chunk,
and must not pay for importing the scheduler, the backends and tenacity.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def map_chunk(fn: Callable[[Any], T], chunk: tuple[Any, ...]) -> list[T]:
    """``fn`` over each item (the builtin map: no Python-level loop)."""
    return list(map(fn, chunk))


def starmap_chunk(fn: Callable[..., T], chunk: tuple[tuple[Any, ...], ...]) -> list[T]:
    """``fn(*args)`` over each argument tuple."""
    return list(itertools.starmap(fn, chunk))
