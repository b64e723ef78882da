"""The process's platform: resolved lazily on first use, cached, resettable for tests.

A spawned child process resolves again from the environment it inherited, so it arrives at the
same platform; a forked child inherits the cached one.
"""

from __future__ import annotations

import threading

from .platform import Platform
from .selection import Selection, select_platform

_lock = threading.Lock()
_selection: Selection | None = None


def current_selection() -> Selection:
    """The cached selection, resolving it on first call. Selection errors are raised, not cached."""
    global _selection
    with _lock:
        if _selection is None:
            _selection = select_platform()
        return _selection


def current_platform() -> Platform:
    """The selected platform."""
    return current_selection().platform


def reset_platform() -> None:
    """Forget the cached selection (tests, or after changing ``FD_PLATFORM``)."""
    global _selection
    with _lock:
        _selection = None
