"""The engine's signals: SIGTERM as an exception, Ctrl-C said at once, children started with SIGINT ignored.

Ctrl-C sends SIGINT to the whole foreground process group. Only the engine acts on it: it stops
its children itself (in order, with timeouts) and removes the cache-ready signal, so children
ignore SIGINT from their start and never print a traceback from the middle of their start-up.

A signal handler's exception is raised wherever the main thread is, and two places cannot carry it:
a weakref callback or a ``__del__`` (garbage collection runs them anywhere), where Python prints it
as "Exception ignored" and drops it, so the process would go on as if never signalled
(:func:`redeliver_swallowed_signals` catches exactly those drops and delivers the signal again);
and Paddle's Python code that Paddle's C++ calls back (a tensor's constructor, reached from
``paddle.from_dlpack`` in a cache tensor's export), where the exception unwinds into C++ that cannot
carry it and the process aborts with a C++ traceback (:func:`raise_outside_paddle` delivers the
signal again once Paddle's code has returned).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from types import FrameType
from typing import Any

from ..ipc.console import write_line

STOPPED_EXIT = 128 + signal.SIGTERM  # a child's exit code when the engine stopped it with SIGTERM
STOPPING = "fd-platforms: Ctrl-C: stopping every process of the run (this takes a few seconds)"
STILL_STOPPING = "fd-platforms: still stopping; the run's processes are being ended in order"
REDELIVER_SECONDS = 0.01  # the pause before a dropped signal is sent again
_redelivered: set[int] = set()  # signals sent again after their exception was dropped, not yet handled


class Terminated(BaseException):
    """The engine received SIGTERM; raised like KeyboardInterrupt so every ``finally`` runs."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises :class:`Terminated` in the main thread."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigint_says_stopping() -> Iterator[None]:
    """Inside, the first Ctrl-C says at once that the run is stopping, then raises KeyboardInterrupt
    (every ``finally`` stops children and removes what the run made); later ones only say it is
    still stopping, so a second Ctrl-C cannot cut that clean-up short."""
    interrupted = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if signum in _redelivered:  # the first Ctrl-C's exception was dropped: raise it again
            _redelivered.discard(signum)
            raise KeyboardInterrupt
        if interrupted:
            write_line(STILL_STOPPING)
            return
        interrupted = True
        write_line(STOPPING)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def sigint_ignored_by_children() -> Iterator[None]:
    """Processes started inside ignore SIGINT from their start (:func:`ignore_sigint_in_child`); a Ctrl-C
    to the engine in this window is held and raised as the block ends, never lost.

    The starting thread blocks SIGINT, and a child inherits that mask through fork and exec, so a
    Ctrl-C during its interpreter's start-up waits until the child ignores it. The engine's own
    disposition stays a handler: were it ``SIG_IGN``, setting it would discard a pending SIGINT and
    another thread the kernel handed one to would drop it (a Ctrl-C while workers started was lost).
    """
    held: list[int] = []
    # multiprocessing's resource tracker, started at the first spawn, unblocks SIGINT in the starting thread
    # as it starts (multiprocessing/resource_tracker.py, ensure_running): it starts before the mask is set
    resource_tracker.ensure_running()

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one pending now reaches hold
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # the engine's own handler, now that the child is counted


def ignore_sigint_in_child() -> None:
    """In a child started by :func:`sigint_ignored_by_children`: SIGINT ignored (which discards one that
    came during start-up), then unblocked, so processes this child starts inherit it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def raise_outside_paddle(signum: int, frame: FrameType | None, exc: BaseException) -> None:
    """Raise ``exc`` from the handler of ``signum``, which interrupted ``frame``, unless Paddle's Python
    code is on that stack: then the signal is delivered to the main thread again shortly, and its
    handler raises once Paddle has returned (a stuck Paddle call holds it off; a SIGKILL does not wait)."""
    if _inside_paddle(frame):
        _send_again(signum)
        return
    raise exc


def _inside_paddle(frame: FrameType | None) -> bool:
    paddle = sys.modules.get("paddle")
    location = getattr(paddle, "__file__", None)
    if location is None:
        return False
    root = os.path.dirname(location) + os.sep
    while frame is not None:
        if frame.f_code.co_filename.startswith(root):
            return True
        frame = frame.f_back
    return False


def _send_again(signum: int, *, after: threading.Event | None = None) -> None:
    """``signum`` to the main thread again, REDELIVER_SECONDS from now (and not while ``after`` is set)."""
    main = threading.main_thread().ident
    assert main is not None

    def deliver() -> None:
        while after is not None and after.is_set():  # not while the main thread is still in the dropping hook
            time.sleep(REDELIVER_SECONDS)
        time.sleep(REDELIVER_SECONDS)
        signal.pthread_kill(main, signum)

    threading.Thread(target=deliver, name="fd-platforms redeliver", daemon=True).start()


def _signal_of(exc: BaseException | None) -> int | None:
    """The signal whose handler raised ``exc``, where ``exc`` is one of the run's signal exceptions."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(exc, Terminated) or (isinstance(exc, SystemExit) and exc.code == STOPPED_EXIT):
        return signal.SIGTERM
    return None


def redeliver_swallowed_signals() -> None:
    """From now on in this process, a signal exception Python drops (raised inside a weakref
    callback or ``__del__``) is not printed; the signal is sent to the main thread again, whose
    handler then raises where the exception can propagate. Other dropped exceptions are reported
    as before."""
    previous = sys.unraisablehook
    in_hook = threading.Event()  # raised while the main thread is still in this hook, it would be dropped for good

    def hook(unraisable: Any) -> None:
        signum = _signal_of(unraisable.exc_value)
        if signum is None:
            previous(unraisable)
            return
        in_hook.set()
        try:
            _redelivered.add(signum)
            _send_again(signum, after=in_hook)
        finally:
            in_hook.clear()

    sys.unraisablehook = hook
