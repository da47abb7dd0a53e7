"""A tqdm progress bar that follows an executor (its ``progress=`` hook) or an iterable.

tqdm is the ``progress`` extra; it is imported when a bar is made, never before.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Iterator, Sized
from types import TracebackType
from typing import Any, Generic, TypeVar

from fiberexec._stats import Stats

T = TypeVar("T")
INSTALL_HINT = "progress bars need tqdm: pip install 'fiberexec[progress]'"


def _tqdm() -> Any:
    try:
        module = importlib.import_module("tqdm.auto")
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return module.tqdm


class ProgressBar(Generic[T]):
    """A tqdm bar fed by `Stats` (call it) or by iterating over it.

    Use `progress_bar` to make one.
    """

    def __init__(self, iterable: Iterable[T] | None, total: int | None, **kwargs: Any) -> None:
        self._iterable = iterable
        self._fixed_total = total
        self._lock = threading.Lock()
        self.bar = _tqdm()(iterable, total=total, **kwargs)

    def __call__(self, stats: Stats) -> None:
        """The executor's ``progress=`` hook: the bar shows finished tasks out of submitted."""
        finished = stats.tasks_done + stats.tasks_failed
        with self._lock:
            if self._fixed_total is None:
                self.bar.total = finished + stats.tasks_pending + stats.tasks_running
            self.bar.n = finished
            self.bar.set_postfix(workers=stats.workers, failed=stats.tasks_failed,
                                 retried=stats.tasks_retried, refresh=False)
            self.bar.refresh()

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise TypeError("this progress bar follows an executor; pass an iterable to "
                            "progress_bar() to iterate")
        result: Iterator[T] = iter(self.bar)
        return result

    @property
    def n(self) -> int:
        """How many items or tasks the bar has counted."""
        return int(self.bar.n)

    def close(self) -> None:
        with self._lock:
            self.bar.close()

    def __enter__(self) -> ProgressBar[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def progress_bar(
    iterable: Iterable[T] | None = None,
    *,
    total: int | None = None,
    desc: str | None = "tasks",
    unit: str = "task",
    **tqdm_kwargs: Any,
) -> ProgressBar[T]:
    """A tqdm progress bar for an executor or an ``as_completed``-style loop.

    Args:
        iterable: iterate over the returned bar to get its items, counting each one; without
            it, pass the bar as ``FiberExecutor(progress=...)`` and it follows `Stats`
            (finished tasks out of those submitted so far, unless ``total`` is given).
        total: the expected count (default: ``len(iterable)`` when it has one).
        desc, unit, tqdm_kwargs: passed to ``tqdm``.

    Raises:
        ImportError: tqdm is not installed (``pip install 'fiberexec[progress]'``).

    Example:
        >>> with progress_bar() as bar, FiberExecutor(2, progress=bar) as ex:  # doctest: +SKIP
        ...     results = list(ex.map(work, items))
        >>> for f in progress_bar(as_completed(futures), total=len(futures)):  # doctest: +SKIP
        ...     print(f.result())
    """
    if total is None and isinstance(iterable, Sized):
        total = len(iterable)
    return ProgressBar(iterable, total, desc=desc, unit=unit, **tqdm_kwargs)
