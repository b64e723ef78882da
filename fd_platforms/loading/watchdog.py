"""The bound on a plugin call: a call that has not returned in time ends the process, loudly.

Plugin calls run in the engine's own thread (:mod:`.isolation`), so nothing can stop one from the side, and nothing
of ours touches the process's signals (no handler, no interval timer). Two watchers end a call past its bound, each
writing every thread's stack, in which the call runs inside a frame named for it (plugin, distribution, step, bound
and the variable that sets it): our daemon thread (``fd-platforms watchdog``), at the earliest deadline of the calls
running, exiting with :data:`EXIT_STATUS` (124); and, for a hook that holds the interpreter lock in C,
faulthandler's C timer, kept :data:`BACKSTOP_SECONDS` past the latest deadline, exiting with
:data:`BACKSTOP_EXIT_STATUS` (1). An engine that uses ``faulthandler.dump_traceback_later`` itself sets both bounds
to 0. Fork handlers (:func:`os.register_at_fork`) cancel the C timer across a fork and set it again on both sides.

See docs/platforms.md, "The bound on a plugin call, in detail", for when the C timer is set and why, the stacks,
several threads and nested calls.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import math
import os
import queue
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from ..ipc.timeouts import env_bound

T = TypeVar("T")  #: what the call returns, returned as it is

ENV_DETECT_TIMEOUT = "FD_PLATFORM_DETECT_TIMEOUT"
DEFAULT_DETECT_TIMEOUT = 10.0
"""Seconds for a plugin's import and registration and for each hook that states a fact or answers a
rule (detection, confirmation, which may import paddle and start the device runtime, memory facts)."""
ENV_ALLOC_TIMEOUT = "FD_PLATFORM_ALLOC_TIMEOUT"
DEFAULT_ALLOC_TIMEOUT = 600.0
"""Seconds for each hook that allocates, maps or frees cache memory (host_alloc, a cache tensor's
export, open and close, release_device_memory): a large cache takes long to allocate and zero."""


@dataclass(frozen=True)
class Bound:
    """How long a plugin call may run: ``seconds`` (None: unbounded), read from ``variable``."""

    seconds: float | None
    variable: str

    def describe(self) -> str:
        return f"unbounded ({self.variable})" if self.seconds is None else f"bound {self.seconds:g} s ({self.variable})"


def read_bound(variable: str, default: float) -> Bound:
    """The bound set by environment ``variable`` (unset: ``default``; ``0``: off); a ConfigError naming it.
    Read at every call (an engine may change it), parsed once per value."""
    return _parsed_bound(variable, os.environ.get(variable), default)


@functools.lru_cache(maxsize=64)
def _parsed_bound(variable: str, raw: str | None, default: float) -> Bound:
    seconds = env_bound(variable, default, {} if raw is None else {variable: raw})
    return Bound(seconds, variable if seconds is not None else f"{variable}=0")


def detect_bound() -> Bound:
    """The bound of loading and of every fact and rule hook: ``FD_PLATFORM_DETECT_TIMEOUT``, else 10 s."""
    return read_bound(ENV_DETECT_TIMEOUT, DEFAULT_DETECT_TIMEOUT)


def alloc_bound() -> Bound:
    """The bound of every allocation hook: ``FD_PLATFORM_ALLOC_TIMEOUT``, else 600 s."""
    return read_bound(ENV_ALLOC_TIMEOUT, DEFAULT_ALLOC_TIMEOUT)


BACKSTOP_SECONDS = 5.0
"""How long past the latest deadline faulthandler's C timer waits for our thread; re-set where it is
less than half of this or more than this past the latest deadline."""
EXIT_STATUS = 124  #: our thread ended the process: a call past its bound
BACKSTOP_EXIT_STATUS = 1  #: faulthandler's C timer ended it (its exit=True calls _exit(1))
TIMED_OUT_STATUSES = frozenset({EXIT_STATUS, BACKSTOP_EXIT_STATUS})


@dataclass(frozen=True)
class _Call:
    deadline: float  # monotonic
    label: str  # the outermost call's frame name


_output_fd = 2  # where the stacks go: the process's stderr
_lock = threading.Lock()  # guards the state below and faulthandler's timer
_calls: dict[int, _Call] = {}  # thread id -> its outermost bounded call
_backstop: float | None = None  # when faulthandler's C timer fires (monotonic), None when not set
_wake_at = math.inf  # when our thread next looks, unless woken
_woken = False  # a wake is queued and not yet seen
_wakes: queue.SimpleQueue[None] = queue.SimpleQueue()
_watcher: threading.Thread | None = None
_fork_handlers = False
_inside = threading.local()  # .bound: the Bound of this thread's outermost plugin call, while one runs


def write_to(fd: int) -> None:
    """Send the stacks of a call past its bound to ``fd`` (the screening child's report pipe)."""
    global _output_fd
    with _lock:
        _output_fd = fd
        if _backstop is not None:
            _set_backstop(_backstop, time.monotonic())


def run_bounded(label: str, bound: Bound, fn: Callable[[], T]) -> T:
    """``fn()`` in a frame named ``label``, ending the process if it runs past ``bound`` (see the module)."""
    outer: Bound | None = getattr(_inside, "bound", None)
    if outer is not None or bound.seconds is None:
        return _frame(f"{label}, {(outer or bound).describe()}")(fn)
    named = f"{label}, {bound.describe()}"
    _begin(named, bound.seconds)
    _inside.bound = bound
    try:
        return _frame(named)(fn)
    finally:
        _inside.bound = None
        _end()


def _begin(label: str, seconds: float) -> None:
    global _wake_at
    ident = threading.get_ident()
    with _lock:
        now = time.monotonic()
        deadline = now + seconds
        _calls[ident] = _Call(deadline, label)
        latest = deadline if len(_calls) == 1 else max(call.deadline for call in _calls.values())
        if _backstop is None or not latest + BACKSTOP_SECONDS / 2 <= _backstop <= latest + BACKSTOP_SECONDS:
            _set_backstop(latest + BACKSTOP_SECONDS, now)
        if deadline < _wake_at:
            _wake_at = deadline
            _wake()


def _end() -> None:
    with _lock:
        del _calls[threading.get_ident()]


def _set_backstop(at: float, now: float) -> None:
    global _backstop
    faulthandler.dump_traceback_later(at - now, exit=True, file=_output_fd)
    _backstop = at


def _cancel_backstop() -> None:
    global _backstop
    faulthandler.cancel_dump_traceback_later()
    _backstop = None


def _wake() -> None:
    """Have our thread look now (started here the first time)."""
    global _woken, _watcher
    if _watcher is None:
        _register_fork_handlers()
        _watcher = threading.Thread(target=_watch, name="fd-platforms watchdog", daemon=True)
        _watcher.start()
    if not _woken:
        _woken = True
        _wakes.put(None)


def _watch() -> None:
    """Our thread: end the process at a deadline passed; cancel the C timer once no call needs it.

    Every call's deadline is at least ``BACKSTOP_SECONDS / 2`` before the C timer (:func:`_begin`), so by
    then a call still running is past its deadline."""
    global _wake_at, _woken
    while True:
        with _lock:
            _woken = False
            now = time.monotonic()
            late = next((call for call in _calls.values() if call.deadline <= now), None)
            if late is not None:
                _end_process(late)
            if _backstop is not None and now >= _backstop - BACKSTOP_SECONDS / 2:
                _cancel_backstop()  # no call runs: one running now would be late
            _wake_at = min(
                min((call.deadline for call in _calls.values()), default=math.inf),
                math.inf if _backstop is None else _backstop - BACKSTOP_SECONDS / 2,
            )
            wait = None if math.isinf(_wake_at) else min(max(_wake_at - now, 0.0), threading.TIMEOUT_MAX)
        with contextlib.suppress(queue.Empty):
            _wakes.get(timeout=wait)


def _end_process(call: _Call) -> NoReturn:
    """The line naming ``call``, every thread's stack, then the exit, even where the stacks cannot be written."""
    try:
        os.write(
            _output_fd,
            f"fd-platforms: a plugin call did not return within its bound, so it ends the process (exit status "
            f"{EXIT_STATUS}); every thread's stack follows, the call's frame named: {call.label}\n".encode(
                errors="backslashreplace"
            ),
        )
        faulthandler.dump_traceback(file=_output_fd, all_threads=True)
    finally:
        os._exit(EXIT_STATUS)


def _register_fork_handlers() -> None:
    global _fork_handlers
    if not _fork_handlers:
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork_in_child)
        _fork_handlers = True


def _before_fork() -> None:
    """Hold the state still and cancel the C timer, which a child could never cancel or set again."""
    _lock.acquire()
    if _backstop is not None:
        faulthandler.cancel_dump_traceback_later()


def _after_fork() -> None:
    if _backstop is not None:
        faulthandler.dump_traceback_later(max(_backstop - time.monotonic(), 1e-3), exit=True, file=_output_fd)
    _lock.release()


def _after_fork_in_child() -> None:
    """The child has only the thread that forked: its call (if any) is the one left, on a new watcher."""
    global _backstop, _wake_at, _woken, _watcher, _wakes
    mine = _calls.get(threading.get_ident())
    _calls.clear()
    _backstop, _wake_at, _woken, _watcher, _wakes = None, math.inf, False, None, queue.SimpleQueue()
    _lock.release()
    if mine is not None:
        with _lock:
            _calls[threading.get_ident()] = mine
            _set_backstop(mine.deadline + BACKSTOP_SECONDS, time.monotonic())
            _wake_at = mine.deadline
            _wake()


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
