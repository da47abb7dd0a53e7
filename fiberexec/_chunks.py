"""What runs a chunk of a chunked map inside a worker.

Kept apart from the executor's modules on purpose: a worker imports this on its first chunk,
and must not pay for importing the scheduler, the backends and tenacity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def map_chunk(fn: Callable[[Any], T], chunk: tuple[Any, ...]) -> list[T]:
    """``fn`` over each item. (Not ``list(map(...))``: a `StopIteration` that ``fn`` raises
    would end that list early, and the rest of the chunk would be lost without a word; here
    it fails the chunk, as in the standard library's executor.)"""
    return [fn(item) for item in chunk]


def starmap_chunk(fn: Callable[..., T], chunk: tuple[tuple[Any, ...], ...]) -> list[T]:
    """``fn(*args)`` over each argument tuple (a `StopIteration` fails it: see `map_chunk`)."""
    return [fn(*args) for args in chunk]
