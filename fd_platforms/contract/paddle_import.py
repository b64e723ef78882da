"""Importing paddle the core's way, from any layer and any thread: quiet, keeping the process's
SIGTERM and SIGINT handlers."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

KEPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_GLOG_LEVEL = "GLOG_minloglevel"  # glog's flag, spelled as glog reads it (case-sensitive)
_SIGACTION_BYTES = 256  # room for the C library's struct sigaction (152 bytes on x86-64 and arm64 glibc)


def import_paddle(*, leave_environment: bool = False) -> ModuleType:
    """``import paddle``, done only once a device platform needs it.

    Paddle's C++ INFO log lines (custom-device loading, ...) are hidden unless the user set
    ``GLOG_minloglevel``, and the Python warnings its import prints ("No ccache found", ...) are
    silenced, so a command's stderr stays one line on error; Paddle's errors still show.

    The process keeps its SIGTERM and SIGINT handlers
    (:func:`~fd_platforms.contract.paddle_import.keeping_signal_handlers`), and the two signals are held in this thread
    while paddle loads, so neither reaches Paddle's handler then.

    ``leave_environment``: the ``GLOG_minloglevel`` default holds for the import only (Paddle reads it
    then), for code running in a process that is not ours (a launcher's worker).
    """
    if "paddle" in sys.modules:
        return sys.modules["paddle"]
    added = _GLOG_LEVEL not in os.environ
    os.environ.setdefault(_GLOG_LEVEL, "1")
    held = signal.pthread_sigmask(signal.SIG_BLOCK, KEPT_SIGNALS)
    try:
        with keeping_signal_handlers(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module("paddle")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if added and leave_environment:
            del os.environ[_GLOG_LEVEL]


def paddle_installed() -> bool:
    """Whether ``import paddle`` can find paddle here, asked without importing it."""
    if "paddle" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("paddle") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken paddle entry in sys.modules
        return False


@contextmanager
def keeping_signal_handlers() -> Iterator[None]:
    """Paddle first imported inside the block leaves the process's SIGTERM and SIGINT handlers as they were.

    Importing paddle installs a C++ SIGTERM handler that ends the process at once, skipping every
    ``finally`` and exit hook, and the engine's own handler never runs. Python's ``signal.signal``
    cannot put the old one back outside the main thread, so the C library's ``sigaction`` records
    each handler before and restores it after, from whichever thread imported paddle. Costs nothing
    once paddle is loaded.
    """
    if "paddle" in sys.modules:
        yield
        return
    saved = {signum: _sigaction(signum) for signum in KEPT_SIGNALS}
    try:
        yield
    finally:
        if "paddle" in sys.modules:
            for signum, action in saved.items():
                _sigaction(signum, action)


def _sigaction(signum: int, restore: bytes | None = None) -> bytes:
    """The C library's handler record of ``signum`` (set to ``restore`` first, when given), as raw bytes."""
    import ctypes

    current = ctypes.create_string_buffer(_SIGACTION_BYTES)
    new = None if restore is None else ctypes.create_string_buffer(restore, _SIGACTION_BYTES)
    if _libc_sigaction()(signum, new, current) != 0:
        raise OSError(ctypes.get_errno(), f"sigaction({signum}) failed")
    return current.raw


@functools.cache
def _libc_sigaction() -> Callable[..., int]:
    """The C library's ``sigaction``, loaded once."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).sigaction
