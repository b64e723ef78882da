"""Importing paddle the core's way, from any layer: quiet, and keeping the process's SIGTERM handler."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import warnings
from types import ModuleType


def import_paddle(*, leave_environment: bool = False) -> ModuleType:
    """``import paddle``, done only once a device platform needs it.

    Paddle's C++ INFO log lines (custom-device loading, ...) are hidden unless the user set
    ``GLOG_minloglevel``, and the Python warnings its import prints ("No ccache found", ...) are
    silenced, so a command's stderr stays one line on error; Paddle's errors still show.

    Importing paddle installs a SIGTERM handler that ends the process at once, skipping every
    ``finally`` and exit hook (the cache-ready signal's and the publications' clean-up among them);
    imported here in the main thread, the process keeps the SIGTERM handler it had.

    ``leave_environment``: the ``GLOG_minloglevel`` default holds for the import only (Paddle reads it
    then), for code running in a process that is not ours (a launcher's worker).
    """
    added = "GLOG_minloglevel" not in os.environ
    os.environ.setdefault("GLOG_minloglevel", "1")
    keep = "paddle" not in sys.modules and threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if keep else None
    first = "paddle" not in sys.modules
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            paddle = importlib.import_module("paddle")
        if first and threading.current_thread() is not threading.main_thread():
            keep_eager_mode()
        return paddle
    finally:
        if added and leave_environment:
            del os.environ["GLOG_minloglevel"]
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_KEPT_EAGER_MODES: list[object] = []


def keep_eager_mode() -> None:
    """Keep the eager mode that importing paddle gave the calling thread, for the whole process.

    Paddle's import enters dynamic (eager) mode through a context manager kept in the importing
    thread's thread-local state; when that thread ends, the manager is closed, which sets Paddle's
    process-wide tracer to None: every thread started after that is in static-graph mode (where,
    e.g., ``paddle.empty`` refuses ``uint8``). Call this in a thread other than the main one right
    after it imported paddle: the manager is kept alive, so the thread's end changes nothing."""
    paddle = sys.modules.get("paddle")
    framework = getattr(getattr(paddle, "base", None), "framework", None)
    manager = getattr(getattr(framework, "global_var", None), "_functional_dygraph_context_manager", None)
    if manager is not None:
        _KEPT_EAGER_MODES.append(manager)
