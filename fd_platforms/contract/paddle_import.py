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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return importlib.import_module("paddle")
    finally:
        if added and leave_environment:
            del os.environ["GLOG_minloglevel"]
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
