"""Linux futex wait and wake on a 32-bit word in shared memory, through ``ctypes``.

A futex lets a waiter sleep in the kernel until another process changes the word and wakes it:
no extra file or socket to create and clean up. The word is the cache-ready slot itself, so the
shared memory stays the single source of truth. Where futexes are unavailable (not Linux, or an
architecture whose syscall number is not listed) :data:`AVAILABLE` is false and callers fall
back to polling.

A process that only *stores* to the word (FastDeploy's processes write a numpy array and wake
nobody) gives the kernel nothing to wake us with; no kernel mechanism reports a store through
another process's mapping. :func:`sleep_while` therefore also looks at the word on a short,
growing interval (as long as the wait has lasted), capped at :data:`FOREIGN_POLL_SECONDS`: a waker
is seen at once, a plain store within that cap. Each look is one futex call, which returns at once
when the word differs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import time
from collections.abc import Callable

from ..contract.integers import INT32_MAX

# SYS_futex per machine; the generic syscall table (aarch64, riscv64, loongarch64) uses 98.
_SYSCALL_NUMBERS = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "loongarch64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE): the word is mapped by several processes
_WAKE_ALL = INT32_MAX  # FUTEX_WAKE's count is an int: every waiter
FIRST_POLL_SECONDS = 0.001  #: the first look for a plain store; later ones as far apart as the wait has lasted ...
FOREIGN_POLL_SECONDS = 0.015  #: ... up to this: the longest a store that wakes nobody goes unseen


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> tuple[Callable[..., int], int] | None:
    number = _SYSCALL_NUMBERS.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall, number


_SYSCALL = _load()
AVAILABLE = _SYSCALL is not None  #: whether this host's futex syscall can be called (else a wait polls)


def _call(
    caller: str, address: int, operation: int, value: int, timeout: object
) -> tuple[Callable[..., int], tuple[object, ...]]:
    """The syscall and its arguments for ``operation`` on the int32 at ``address`` (``caller`` names the
    function in the assertion where futexes are unavailable)."""
    assert _SYSCALL is not None, f"futex.{caller} called where futex.AVAILABLE is false"
    syscall, number = _SYSCALL
    arguments = (ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_int(operation), ctypes.c_int(value))
    return syscall, (*arguments, timeout, None, ctypes.c_int(0))


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the int32 at ``address`` equals ``expected``, for at most ``timeout`` seconds.

    Returns on a wake, a timeout, a changed word or a signal (the caller re-checks the word; a
    pending ``KeyboardInterrupt`` is raised by Python as soon as this returns).
    """
    seconds = max(timeout, 0.0)
    span = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
    syscall, call = _call("wait", address, _FUTEX_WAIT, expected, ctypes.byref(span))
    _timed_out(syscall(*call))


def sleep_while(address: int, expected: int, seconds: float, since: float | None = None) -> None:
    """Sleep up to ``seconds`` while the int32 at ``address`` equals ``expected``.

    Returns early on a futex wake, on a signal, or within :data:`FOREIGN_POLL_SECONDS` of a plain
    store that changed the word; the caller re-reads the word. The looks for a plain store come as
    far apart as the word has been waited on — since ``since`` (``time.monotonic()``; default: now),
    at least :data:`FIRST_POLL_SECONDS`, at most :data:`FOREIGN_POLL_SECONDS` — so a caller that
    sleeps in slices passes its wait's start and the looks do not start fast again with every
    slice. ``OSError`` as :func:`wait`. Each look costs one system call and little Python.
    """
    span = _Timespec(0, 0)
    syscall, call = _call("sleep_while", address, _FUTEX_WAIT, expected, ctypes.byref(span))
    now = time.monotonic()
    end = now + max(seconds, 0.0)
    since = now if since is None else min(since, now)
    while True:
        step = min(max(now - since, FIRST_POLL_SECONDS), FOREIGN_POLL_SECONDS, end - now)
        if step < 1e-6:  # nothing left to sleep (a shorter timespec would be 0: a busy call)
            return
        span.tv_sec, span.tv_nsec = int(step), int((step % 1.0) * 1e9)
        if not _timed_out(syscall(*call)):
            return  # woken, the word differs, or a signal: the caller looks
        now = time.monotonic()


def _timed_out(result: int) -> bool:
    """Whether a ``FUTEX_WAIT`` ran its whole timeout; False for a wake, a changed word (``EAGAIN``) or
    a signal (``EINTR``); any other failure is an ``OSError``."""
    if result != -1:
        return False
    code = ctypes.get_errno()
    if code == errno.ETIMEDOUT:
        return True
    if code in (errno.EAGAIN, errno.EINTR):
        return False
    raise OSError(code, f"futex wait failed: {os.strerror(code)}")


def wake(address: int) -> int:
    """Wake every process sleeping on the int32 at ``address``; the number woken."""
    syscall, call = _call("wake", address, _FUTEX_WAKE, _WAKE_ALL, None)
    result = syscall(*call)
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"futex wake failed: {os.strerror(code)}")
    return int(result)
