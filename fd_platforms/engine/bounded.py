"""Calls into Paddle's collective runtime, bounded in time.

A store connection to a master that never answers, a key that never comes, a collective whose
peer machine lost power: Paddle's own waits are long (its store waits up to 900 s) or endless.
:func:`bounded` runs such a call in a daemon thread (Paddle releases the interpreter lock while it
waits) and gives up after a deadline; the thread is abandoned (a daemon thread does not keep the
process from exiting: a node whose peer hangs exits within its ``--timeout``, tested).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ..contract.errors import FdPlatformsError

T = TypeVar("T")  #: what the call returns, returned as it is


def bounded(call: Callable[[], T], seconds: float, timed_out: Callable[[], FdPlatformsError]) -> T:
    """``call()``'s value or exception, or ``timed_out()`` raised once ``seconds`` have passed."""
    done = threading.Event()
    value: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            value.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as is
            raised.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="fd-platforms collective call", daemon=True).start()
    if not done.wait(max(0.0, seconds)):
        raise timed_out()
    if raised:
        raise raised[0]
    return value[0]
