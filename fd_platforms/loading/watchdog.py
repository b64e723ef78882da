"""The bound on a plugin call: a call that has not returned in time ends the process, loudly.

Plugin calls run in the engine's own thread (:mod:`.isolation`), so nothing can stop one from the
side: CPython cannot interrupt a thread, and a hook that holds the interpreter lock (a
catastrophic regex, a C loop) keeps every other Python thread and every Python signal handler from
running at all. What still runs then is C: the kernel's interval timer (``setitimer``) sends
SIGALRM at the deadline, and :mod:`faulthandler`, registered for SIGALRM, writes every thread's
stack from its C signal handler with async-signal-safe writes, then passes the signal to its
default action, which ends the process (exit status 142 in a shell, -14 to ``subprocess``:
:data:`EXIT_STATUS`). faulthandler's other watchdog, ``dump_traceback_later``, would do the same
but starts and joins a C thread at every arming: 25 µs a call on an idle machine and hundreds on
a busy one, against about 1 µs for two ``setitimer`` calls (``benchmarks/hook_calls.py``).

faulthandler's lines are fixed, so the call runs inside a frame whose function name is the line
that says which call it is: plugin, distribution, step, bound and the variable that sets it. The
stack shows it under the plugin's own frames::

    Current thread 0x00007f3a2b1c4740 (most recent call first):
      File "/site-packages/fd_platforms_hangs/__init__.py", line 9 in device_memory
      ...
      File ".../watchdog.py", line 150 in fd-platforms: plugin 'hangs' ... bound 2 s (FD_PLATFORM_DETECT_TIMEOUT)

The process has one real-time interval timer and one SIGALRM handler: a process that handles
SIGALRM itself is refused when the watchdog is first armed, and an engine with a watchdog of its
own (``signal.alarm``, ``setitimer``) sets both bounds to 0, which arms nothing. Several engine
threads calling plugins at once share the timer; it is set for the earliest deadline. A call made
from inside another (the hooks a plugin's loading runs) counts against the outer call's bound.
"""

from __future__ import annotations

import faulthandler
import functools
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..contract.errors import ConfigError
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
EXIT_STATUS = -signal.SIGALRM  # the process ends by SIGALRM's default action (a shell reports 142)


@dataclass(frozen=True)
class Bound:
    """How long a plugin call may run: ``seconds`` (None: unbounded), read from ``variable``."""

    seconds: float | None
    variable: str

    def describe(self) -> str:
        return f"unbounded ({self.variable})" if self.seconds is None else f"bound {self.seconds:g} s ({self.variable})"


def read_bound(variable: str, default: float) -> Bound:
    """The bound set by environment ``variable`` (unset: ``default``; ``0``: off); a ConfigError naming it."""
    seconds = env_bound(variable, default)
    return Bound(seconds, variable if seconds is not None else f"{variable}=0")


def detect_bound() -> Bound:
    """The bound of loading and of every fact and rule hook: ``FD_PLATFORM_DETECT_TIMEOUT``, else 10 s."""
    return read_bound(ENV_DETECT_TIMEOUT, DEFAULT_DETECT_TIMEOUT)


def alloc_bound() -> Bound:
    """The bound of every allocation hook: ``FD_PLATFORM_ALLOC_TIMEOUT``, else 600 s."""
    return read_bound(ENV_ALLOC_TIMEOUT, DEFAULT_ALLOC_TIMEOUT)


_output_fd = 2  # where faulthandler writes: the process's stderr
_registered = False  # faulthandler's SIGALRM handler is installed
_deadlines: dict[int, float] = {}  # thread id -> monotonic deadline of its outermost bounded call
_lock = threading.Lock()
_inside = threading.local()  # .bound: the Bound of this thread's outermost plugin call, while one runs


def write_to(fd: int) -> None:
    """Send the stacks of a call past its bound to ``fd`` (the screening child's report pipe)."""
    global _output_fd
    _output_fd = fd
    if _registered:
        faulthandler.register(signal.SIGALRM, file=fd, all_threads=True, chain=True)


def run_bounded(label: str, bound: Bound, fn: Callable[[], T]) -> T:
    """``fn()`` in a frame named ``label``, ending the process if it runs past ``bound`` (see the module)."""
    outer: Bound | None = getattr(_inside, "bound", None)
    if outer is not None or bound.seconds is None:
        return _frame(f"{label}, {(outer or bound).describe()}")(fn)
    _arm(bound, bound.seconds)
    _inside.bound = bound
    try:
        return _frame(f"{label}, {bound.describe()}")(fn)
    finally:
        _inside.bound = None
        _disarm()


def _arm(bound: Bound, seconds: float) -> None:
    with _lock:
        _register(bound)
        now = time.monotonic()
        _deadlines[threading.get_ident()] = now + seconds
        _set_timer(now)


def _disarm() -> None:
    with _lock:
        _deadlines.pop(threading.get_ident(), None)
        _set_timer(time.monotonic())


def _set_timer(now: float) -> None:
    """The process's real-time interval timer, set for the earliest deadline of any thread (off when none)."""
    left = min(_deadlines.values()) - now if _deadlines else 0.0
    signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6) if _deadlines else 0.0)


def _register(bound: Bound) -> None:
    """faulthandler's handler for SIGALRM, installed once; refused where the process handles SIGALRM itself."""
    global _registered
    if signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:
        raise ConfigError(
            bound.variable,
            f"{bound.seconds:g}",
            "0 in a process that handles SIGALRM itself",
            "the watchdog of plugin calls ends a call past its bound by SIGALRM, which this process handles "
            "(signal.signal): set FD_PLATFORM_DETECT_TIMEOUT=0 and FD_PLATFORM_ALLOC_TIMEOUT=0 to leave "
            "bounding plugin calls to the engine's own watchdog",
        )
    if not _registered:
        faulthandler.register(signal.SIGALRM, file=_output_fd, all_threads=True, chain=True)
        _registered = True


def _enter(fn: Callable[[], T]) -> T:
    """The frame a plugin call runs in; :func:`_frame` gives copies of it a name saying which call."""
    return fn()


@functools.lru_cache(maxsize=256)
def _frame(label: str) -> Callable[[Callable[[], T]], T]:
    """:func:`_enter` with ``label`` as its function name, which faulthandler prints for its frame."""
    code = _enter.__code__.replace(co_name=label)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=label)
    return types.FunctionType(code, _enter.__globals__, label)
