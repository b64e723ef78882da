"""Calls into plugin code: in the caller's thread, isolated from every exception, bounded in time.

Plugins are untrusted code, but they run where the engine runs. Paddle's state (eager mode), the
device runtime's (CUDA's current device is per thread) and the engine's signal handlers belong to
the engine's thread, so a call on a thread of its own would see device 0 and leave its state
behind. Every call the core makes into the selected plugin — its import and registration, each
hook it implements, a cache tensor's close — goes through :func:`call_plugin`, in the caller's
thread:

- whatever the plugin raises becomes a :class:`~fd_platforms.contract.errors.PluginError` naming the
  plugin, its distribution and the step, ``SystemExit`` included; ``KeyboardInterrupt`` stays the
  user's Ctrl-C (:func:`blame_interrupts` makes it the plugin's where no user can press it), and so
  does what one of the process's own signal handlers raised (the engine's stop: handlers run in the
  main thread wherever it is, plugin code included); a deliberate fd-platforms error
  (``HostAllocError``, ...) passes through, and a record built with bad fields becomes a
  :class:`~fd_platforms.contract.errors.PluginContractError`;
- a call that has not returned within its bound ends the process, naming the call (:mod:`.watchdog`);
- a plugin that closes or replaces descriptor 0, 1 or 2 is blamed by name: each call compares the
  three descriptors' files before and after it (files, not numbers: another thread may open a file
  onto a freed number), and a closed one is reopened on /dev/null;
- paddle first imported by the plugin leaves the engine's SIGTERM and SIGINT handlers in place.

The plugins a command did not name are loaded and detected in a child process
(:mod:`.screening`): that is where unknown code runs.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..contract.errors import (
    FdPlatformsError,
    PluginContractError,
    PluginError,
    PluginLoadError,
    RecordError,
    show_value,
)
from ..contract.paddle_import import keeping_signal_handlers
from .watchdog import Bound, detect_bound, run_bounded

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .discovery import Candidate

T = TypeVar("T")  #: what the call returns, returned as it is

_interrupts_are_plugins = False


def blame_interrupts() -> None:
    """From now on a ``KeyboardInterrupt`` out of plugin code is the plugin's error (the screening
    child's: a user's Ctrl-C ends its parent, which ends it)."""
    global _interrupts_are_plugins
    _interrupts_are_plugins = True


def call_plugin(
    candidate: Candidate,
    step: str,
    fn: Callable[[], T],
    bound: Bound,
    *,
    error: type[PluginError] = PluginError,
    fix: str = "",
    verb: str = "raised",
) -> T:
    """Run ``fn()`` as plugin code, here and now, within ``bound``.

    ``step`` names it in errors (``"hook detect_platform"``); a raised exception becomes ``error``
    with the message ``"<step> <verb> <exception>. Fix: <fix>"``.
    """
    streams = tuple(_file_of(fd) for fd, _ in _STANDARD_STREAMS)
    label = f"fd-platforms: plugin {candidate.name!r} (distribution {candidate.distribution}), {step}"
    raised: BaseException | None = None
    try:
        with keeping_signal_handlers():
            result = run_bounded(label, bound, fn)
    except BaseException as exc:  # noqa: BLE001 - plugins are untrusted: SystemExit included
        raised = exc
    disturbed = _check_standard_streams(streams)
    if disturbed:  # the damage came before the call's own outcome, and outlives it
        raise candidate.error(
            PluginContractError,
            f"{step} closed the process's {' and '.join(disturbed)} (a closed one is reopened on /dev/null, "
            "so no file opened later takes its number). Fix: never close file descriptors 0, 1 or 2 in a plugin",
        ) from raised
    if raised is None:
        return result
    if (isinstance(raised, KeyboardInterrupt) and not _interrupts_are_plugins) or _from_a_signal_handler(raised):
        raise raised
    raise blame(candidate, step, raised, error, fix, verb) from raised


def import_plugin(candidate: Candidate) -> object:
    """The object ``candidate``'s entry point names, imported as plugin code: whatever the import raises,
    ``SystemExit`` included, is a :class:`~fd_platforms.contract.errors.PluginLoadError` naming it."""
    return call_plugin(
        candidate,
        f"importing {candidate.entry_point.value!r}",
        candidate.load,
        detect_bound(),
        error=PluginLoadError,
        fix=f"reinstall {candidate.distribution} or uninstall it",
        verb="failed:",
    )


def _from_a_signal_handler(raised: BaseException) -> bool:
    """Whether ``raised`` came out of one of this process's Python signal handlers: a frame of its
    traceback runs the code of a handler installed now."""
    handlers = {getattr(signal.getsignal(signum), "__code__", None) for signum in signal.valid_signals()}
    traceback = raised.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code in handlers:
            return True
        traceback = traceback.tb_next
    return False


_STANDARD_STREAMS = ((0, "stdin"), (1, "stdout"), (2, "stderr"))
_reopening = threading.Lock()


def _file_of(fd: int) -> tuple[int, int] | None:
    """The (device, inode) of the file open on ``fd``; None when it is closed."""
    try:
        found = os.fstat(fd)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _check_standard_streams(before: tuple[tuple[int, int] | None, ...]) -> list[str]:
    """The standard descriptors that were open on one file before a call and are closed or on another
    file now; a closed one is opened again on /dev/null (one closed before the call too, unblamed)."""
    disturbed = []
    with _reopening:
        for (fd, label), was in zip(_STANDARD_STREAMS, before, strict=True):
            now = _file_of(fd)
            if was is not None and now != was:
                disturbed.append(label)
            if now is None:
                spare = os.open(os.devnull, os.O_RDWR)
                if spare != fd:
                    os.dup2(spare, fd)
                    os.close(spare)
    return disturbed


def blame(
    candidate: Candidate, step: str, raised: BaseException, error: type[PluginError], fix: str, verb: str = "raised"
) -> FdPlatformsError:
    """The error a plugin's exception becomes (a deliberate fd-platforms error stays itself)."""
    if isinstance(raised, RecordError):
        return candidate.error(PluginContractError, f"{step} built a bad record: {raised}")
    if isinstance(raised, FdPlatformsError):
        return raised
    return candidate.error(error, f"{step} {verb} {describe(raised)}" + (f". Fix: {fix}" if fix else ""))


def describe(raised: BaseException) -> str:
    """``OSError: driver mismatch``; ``SystemExit(3)`` and ``KeyboardInterrupt()`` as written; never raises."""
    try:
        text = str(raised) if isinstance(raised, Exception) else ""
        return f"{type(raised).__name__}: {text}" if text else show_value(raised)
    except Exception:  # noqa: BLE001 - a plugin's exception whose str() fails still gets reported
        return type(raised).__name__
