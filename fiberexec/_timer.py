"""A one-shot timer that a thread waits on with ``poll``, armed and disarmed from another
thread without waking anyone: Linux's ``timerfd``, reached through libc.

A worker uses it to start watching its link only once a task has run for a while: arming
and disarming are one system call each, where waking a thread for every task costs two
context switches and a fight for the GIL with the task itself. Where the kernel or libc has
no ``timerfd``, the timer fires at once (an ``eventfd``): the same behaviour, without the
saving.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's too
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()  # once per process (a worker forked by the launcher has it already)


class OneShot:
    """``arm(seconds)`` makes `fileno` readable that much later, unless `disarm` comes
    first; `drain` takes the expiry back so the descriptor reads as idle again."""

    def __init__(self) -> None:
        self._libc = _LIBC
        fd = -1
        if self._libc is not None:
            fd = self._libc.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd >= 0:
            self._fd = fd
            self._kernel = True
        else:  # no timerfd: an eventfd that the arming writes, so it fires at once
            self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._kernel = False
        self._off = ctypes.byref(_Itimerspec())  # (a reference made once: each is a call)
        self._spec = (0.0, self._off)  # the last arming, kept: a task path arms the same

    def fileno(self) -> int:
        return self._fd

    @property
    def exact(self) -> bool:
        """Whether it fires when it was armed to (a kernel timer), not as it is armed."""
        return self._kernel

    def arm(self, seconds: float) -> None:
        if not self._kernel:
            os.eventfd_write(self._fd, 1)
            return
        assert self._libc is not None
        last, spec = self._spec
        if last != seconds:
            whole = int(seconds)
            spec = ctypes.byref(_Itimerspec(
                _Timespec(0, 0), _Timespec(whole, max(1, int((seconds - whole) * 1e9)))))
            self._spec = (seconds, spec)
        if self._libc.timerfd_settime(self._fd, 0, spec, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def disarm(self) -> None:
        if self._kernel:
            assert self._libc is not None
            self._libc.timerfd_settime(self._fd, 0, self._off, None)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)

    def close(self) -> None:
        os.close(self._fd)
