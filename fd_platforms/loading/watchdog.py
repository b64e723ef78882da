"""The bound on a plugin call: a call that has not returned in time ends the process, loudly.

Plugin calls run in the engine's own thread (:mod:`.isolation`), so nothing can stop one from
the side: CPython cannot interrupt a thread, and a hook that holds the interpreter lock (a
catastrophic regex, a C loop) keeps every other Python thread and every Python signal handler
from running at all. The standard library's :mod:`faulthandler` watchdog still runs then: its
timer is a C thread that never takes the interpreter lock, writes every thread's stack with
async-signal-safe writes and ends the process with ``_exit(1)``. That is why the bound is
faulthandler's ``dump_traceback_later(exit=True)``: the one stdlib mechanism that works in every
case, at about 25 µs a call (it starts its C thread per arming).

faulthandler's first line is fixed (``Timeout (0:00:10)!``), so the call runs inside a frame whose
function name is the line that says which call it is: plugin, distribution, step, bound and the
variable that sets it. The stack shows it under the plugin's own frames::

    Timeout (0:00:02)!
    Thread 0x00007f3a2b1c4740 (most recent call first):
      File "/site-packages/fd_platforms_hangs/__init__.py", line 9 in device_memory
      ...
      File ".../fd_platforms/loading/watchdog.py", line 91 in fd-platforms: plugin 'hangs' ... bound 2 s (FD_PLATFORM_DETECT_TIMEOUT)

The process then exits with status 1 (:data:`EXIT_STATUS`). faulthandler holds one such timer per
process: an engine that arms its own (``faulthandler.dump_traceback_later``) sets both bounds to 0,
which arms nothing. Several engine threads calling plugins at once share the timer; it is armed for
the earliest deadline. A call made from inside another (the hooks a plugin's loading runs) counts
against the outer call's bound.
"""

from __future__ import annotations

import faulthandler
import functools
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..ipc.timeouts import env_bound

T = TypeVar("T")

ENV_DETECT_TIMEOUT = "FD_PLATFORM_DETECT_TIMEOUT"
DEFAULT_DETECT_TIMEOUT = 10.0
"""Seconds for a plugin's import and registration and for each hook that states a fact or answers a
rule (detection, confirmation, which may import paddle and start the device runtime, memory facts)."""
ENV_ALLOC_TIMEOUT = "FD_PLATFORM_ALLOC_TIMEOUT"
DEFAULT_ALLOC_TIMEOUT = 600.0
"""Seconds for each hook that allocates, maps or frees cache memory (host_alloc, a cache tensor's
export, open and close, release_device_memory): a large cache takes long to allocate and zero."""
EXIT_STATUS = 1  # faulthandler's _exit(1)


@dataclass(frozen=True)
class Bound:
    """How long a plugin call may run: ``seconds`` (None: unbounded), read from ``variable``."""

    seconds: float | None
    variable: str

    def describe(self) -> str:
        return f"unbounded ({self.variable}=0)" if self.seconds is None else f"bound {self.seconds:g} s ({self.variable})"


def read_bound(variable: str, default: float) -> Bound:
    """The bound set by environment ``variable`` (unset: ``default``; ``0``: off); a ConfigError naming it."""
    return Bound(env_bound(variable, default), variable)


def detect_bound() -> Bound:
    """The bound of loading and of every fact and rule hook: ``FD_PLATFORM_DETECT_TIMEOUT``, else 10 s."""
    return read_bound(ENV_DETECT_TIMEOUT, DEFAULT_DETECT_TIMEOUT)


def alloc_bound() -> Bound:
    """The bound of every allocation hook: ``FD_PLATFORM_ALLOC_TIMEOUT``, else 600 s."""
    return read_bound(ENV_ALLOC_TIMEOUT, DEFAULT_ALLOC_TIMEOUT)


_output_fd = 2  # where faulthandler writes: the process's stderr
_deadlines: dict[int, float] = {}  # thread id -> monotonic deadline of its outermost bounded call
_lock = threading.Lock()
_inside = threading.local()  # .bound: the Bound of this thread's outermost plugin call, while one runs


def write_to(fd: int) -> None:
    """Send the stacks of a call past its bound to ``fd`` (the screening child's report pipe)."""
    global _output_fd
    _output_fd = fd


def run_bounded(label: str, bound: Bound, fn: Callable[[], T]) -> T:
    """``fn()`` in a frame named ``label``, ending the process if it runs past ``bound`` (see the module)."""
    outer: Bound | None = getattr(_inside, "bound", None)
    if outer is not None or bound.seconds is None:
        return _frame(f"{label}, {(outer or bound).describe()}")(fn)
    _arm(bound.seconds)
    _inside.bound = bound
    try:
        return _frame(f"{label}, {bound.describe()}")(fn)
    finally:
        _inside.bound = None
        _disarm()


def _arm(seconds: float) -> None:
    with _lock:
        now = time.monotonic()
        _deadlines[threading.get_ident()] = now + seconds
        _set_timer(now)


def _disarm() -> None:
    with _lock:
        _deadlines.pop(threading.get_ident(), None)
        _set_timer(time.monotonic())


def _set_timer(now: float) -> None:
    """faulthandler's one timer, armed for the earliest deadline of any thread (cancelled when none)."""
    if not _deadlines:
        faulthandler.cancel_dump_traceback_later()
        return
    left = min(_deadlines.values()) - now
    faulthandler.dump_traceback_later(max(left, 0.001), exit=True, file=_output_fd)


def _enter(fn: Callable[[], T]) -> T:
    """The frame a plugin call runs in; :func:`_frame` gives copies of it a name saying which call."""
    return fn()


@functools.lru_cache(maxsize=256)
def _frame(label: str) -> Callable[[Callable[[], T]], T]:
    """:func:`_enter` with ``label`` as its function name, which faulthandler prints for its frame."""
    names = {"co_name": label, "co_qualname": label} if sys.version_info >= (3, 11) else {"co_name": label}
    code = _enter.__code__.replace(**names)  # type: ignore[arg-type]
    return types.FunctionType(code, _enter.__globals__, label)
