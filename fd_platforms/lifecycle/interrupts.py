"""The engine's signals: SIGTERM as an exception, Ctrl-C said at once, children started with SIGINT ignored.

Ctrl-C sends SIGINT to the whole foreground process group. Only the engine acts on it: it stops
its children itself (in order, with timeouts) and removes the cache-ready signal, so children
inherit SIGINT ignored and never print a traceback from the middle of their start-up.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ..console import write_line


STOPPING = "fd-platforms: Ctrl-C: stopping every process of the run (this takes a few seconds)"
STILL_STOPPING = "fd-platforms: still stopping; the run's processes are being ended in order"


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
    """Processes started inside inherit SIGINT ignored.

    SIGINT is blocked meanwhile, so a Ctrl-C in this short window reaches the engine right after it
    instead of being lost.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
