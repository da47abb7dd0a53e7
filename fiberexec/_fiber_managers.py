"""Fiber's `AsyncManager`: its proxies' method calls return handles that are both Fiber's
results (``get``) and `concurrent.futures.Future`s.

Built on `fiberexec.multiprocessing.managers.AsyncManager`, whose calls return plain
futures: `HandleProxy` gives each call's outcome to an `AsyncHandle` as it arrives.

    env.step(a) --AsyncProxy--> Future (the manager's call thread) --> AsyncHandle
    handle.get(timeout) / ready() / wait() / successful()  (as multiprocessing's AsyncResult)
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence
from typing import Any

from fiberexec.multiprocessing import TimeoutError as MpTimeoutError
from fiberexec.multiprocessing import managers


class AsyncHandle(cf.Future[Any]):
    """A call's outcome: a `Future`, with `multiprocessing.pool.AsyncResult`'s methods."""

    def get(self, timeout: float | None = None) -> Any:
        """The call's return value, or raise what it raised; ``multiprocessing.TimeoutError``
        (which is also the builtin `TimeoutError`) after ``timeout`` seconds."""
        try:
            return self.result(timeout)
        except cf.TimeoutError:
            if self.done():
                raise  # the call itself raised it
            raise MpTimeoutError(f"no result within {timeout}s") from None

    def ready(self) -> bool:
        """Whether the call has finished."""
        return self.done()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the call finishes, or ``timeout`` seconds."""
        cf.wait([self], timeout)

    def successful(self) -> bool:
        """Whether the call returned without raising; `ValueError` if it has not finished."""
        if not self.done():
            raise ValueError(f"{self!r} not ready")
        return not self.cancelled() and self.exception(timeout=0) is None

    @classmethod
    def following(cls, source: cf.Future[Any]) -> AsyncHandle:
        """A handle that takes ``source``'s outcome (cancelling it cancels ``source``)."""
        handle = cls()
        handle.add_done_callback(lambda h: source.cancel() if h.cancelled() else None)
        source.add_done_callback(lambda s: _settle(handle, s))
        return handle


def _settle(handle: AsyncHandle, source: cf.Future[Any]) -> None:
    if source.cancelled():
        handle.cancel()
    elif handle.set_running_or_notify_cancel():
        error = source.exception()
        if error is None:
            handle.set_result(source.result())
        else:
            handle.set_exception(error)


class HandleProxy(managers.AsyncProxy):
    """An `AsyncProxy` whose method calls return `AsyncHandle`s."""

    def __getattr__(self, name: str) -> Any:
        submit: Callable[..., cf.Future[Any]] = super().__getattr__(name)

        def call(*args: Any, **kwds: Any) -> AsyncHandle:
            return AsyncHandle.following(submit(*args, **kwds))

        call.__name__ = name
        return call


class AsyncManager(managers.AsyncManager):
    """Fiber's `AsyncManager`: a manager whose objects' method calls return `AsyncHandle`s.

    Example:
        >>> class Calculator:
        ...     def add(self, a, b):
        ...         return a + b
        >>> class MyManager(AsyncManager):
        ...     pass
        >>> MyManager.register("Calculator", Calculator)
        >>> with MyManager() as manager:  # doctest: +SKIP
        ...     manager.Calculator().add(10, 32).get(timeout=30)
        42
    """

    @classmethod
    def register(  # noqa: PLR0917  # the standard library's signature
            cls, typeid: str, callable: Callable[..., Any] | None = None,
            proxytype: type[managers.BaseProxy] | None = None,
            exposed: Sequence[str] | None = None,
            method_to_typeid: dict[str, str] | None = None,
            create_method: bool = True) -> None:
        """`BaseManager.register`, with `HandleProxy` as the default proxy type."""
        super().register(typeid, callable, proxytype or HandleProxy, exposed,
                         method_to_typeid, create_method)
