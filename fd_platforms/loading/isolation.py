"""Calls into plugin code: bounded in time and isolated from every exception.

Plugins are untrusted code. Every call the core makes into one — its import and registration, and
each hook it implements — runs through :class:`PluginCall`: in a daemon thread of its own, waited
for at most a bound. Whatever the plugin raises, ``SystemExit`` and ``KeyboardInterrupt``
included, becomes a :class:`~fd_platforms.contract.errors.PluginError` naming the plugin, its distribution
and the step; a deliberate fd-platforms error (``HostAllocError``, ...) passes through, and a record
built with bad fields becomes a :class:`~fd_platforms.contract.errors.PluginContractError`. A call past its
bound is a :class:`~fd_platforms.contract.errors.PluginTimeoutError` naming the step it was in and the time;
its thread is abandoned (a daemon thread never keeps the process from exiting) and callers mark the
plugin broken so nothing waits on it again.

A plugin that closes (or replaces) descriptor 0, 1 or 2 is blamed by name: each call compares the
three descriptors' files before and after it, and reopens a closed one on /dev/null. Another thread
may open a file onto a freed number before the check, which is why files are compared, not only
looked up. When other plugin calls ran at the same time, the culprit is not certain: the error is a
:class:`StreamsDisturbed`, and the screening child's caller detects those plugins again one at a time.

The wait happens in the caller's thread, so Ctrl-C (and the run's SIGTERM) still interrupt it at
once. Calls made from inside a plugin call (the hooks a plugin's loading runs) run inline, counted
against the outer call's bound, and report the step they are in.

Limit: code that holds the interpreter lock without ever releasing it (an endless loop inside a C
extension) stalls every thread of the process; nothing in-process can bound that.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from ..contract.errors import (
    FdPlatformsError,
    PluginContractError,
    PluginError,
    PluginTimeoutError,
    RecordError,
    show_value,
)
from ..contract.paddle_import import keep_eager_mode
from ..ipc.timeouts import env_seconds, knob

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .discovery import Candidate

T = TypeVar("T")

ENV_DETECT_TIMEOUT = "FD_PLATFORM_DETECT_TIMEOUT"
DEFAULT_DETECT_TIMEOUT = 10.0
"""Seconds a plugin gets for its import, registration, detection, confirmation (which may import
paddle and start the device runtime) and each rule hook."""

_current = threading.local()  # .call: the PluginCall whose thread this is


def detect_timeout() -> float:
    """The bound of discovery, selection and rule hooks: ``FD_PLATFORM_DETECT_TIMEOUT``, else 10 s."""
    return env_seconds(ENV_DETECT_TIMEOUT, DEFAULT_DETECT_TIMEOUT)


class PluginCall(Generic[T]):
    """``fn()`` running in a daemon thread for plugin ``candidate``, allowed ``bound`` seconds from
    its start; :meth:`result` waits for it (calls started together end together).

    ``step`` names what runs (``"hook detect_platform"``) and is shown in errors; ``error``,
    ``fix`` and ``verb`` shape the error a raised exception becomes (see :func:`call_plugin`);
    ``limit`` is the environment variable the bound was read from, named in a timeout's fix.
    """

    def __init__(
        self,
        candidate: Candidate,
        step: str,
        fn: Callable[[], T],
        bound: float,
        *,
        error: type[PluginError] = PluginError,
        fix: str = "",
        verb: str = "raised",
        limit: str = ENV_DETECT_TIMEOUT,
    ) -> None:
        self.candidate, self.step, self.bound, self.limit = candidate, step, bound, limit
        self.started = time.monotonic()
        self._fn, self._error, self._fix, self._verb = fn, error, fix, verb
        self._done = threading.Event()
        self._value: T | None = None
        self._raised: BaseException | None = None
        self._disturbed: list[str] = []
        self._had_paddle = "paddle" in sys.modules
        self._beside: set[str] = set()  # the plugins whose calls overlapped this one
        self._streams = _stream_files()
        _join_running(self)
        self._thread = threading.Thread(
            target=self._run, name=f"fd-platforms plugin {candidate.name}: {step}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        _current.call = self
        try:
            self._value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - plugins are untrusted: SystemExit included
            self._raised = exc
        finally:
            if not self._had_paddle and "paddle" in sys.modules:
                keep_eager_mode()  # the plugin imported paddle in this thread, which ends soon
            self._disturbed = _check_standard_streams(self._streams)  # at once, in the plugin's own thread
            _leave_running(self)
            self._done.set()

    def result(self) -> T:
        """The value, or the plugin's error; :class:`PluginTimeoutError` once the bound has passed."""
        if not self._done.wait(max(0.0, self.started + self.bound - time.monotonic())):
            raise PluginTimeoutError(
                self.candidate.name,
                self.candidate.distribution,
                f"{self.step} did not return within {self.bound:g} s, so the plugin is marked broken. "
                f"Fix: repair or uninstall {self.candidate.distribution}; if it legitimately takes longer, "
                f"raise {knob(self.limit)}",
                step=self.step,
                seconds=self.bound,
            )
        _settle_paddle(self._had_paddle)
        if self._disturbed:
            raise self._stream_error()
        if self._raised is not None:
            raise blame(self.candidate, self.step, self._raised, self._error, self._fix, self._verb) from self._raised
        return self._value  # type: ignore[return-value]

    def _stream_error(self) -> PluginContractError:
        streams = " and ".join(self._disturbed)
        fix = "Fix: never close file descriptors 0, 1 or 2 in a plugin"
        if not self._beside:
            return PluginContractError(
                self.candidate.name,
                self.candidate.distribution,
                f"{self.step} closed the process's {streams} (a closed one is reopened on /dev/null, so no file "
                f"opened later takes its number). {fix}",
            )
        return StreamsDisturbed(
            self.candidate.name,
            self.candidate.distribution,
            f"the process's {streams} was closed or replaced while {self.step} ran beside plugin calls of "
            f"{', '.join(sorted(self._beside))}, so it was this plugin or one of those. {fix}",
        )


class StreamsDisturbed(PluginContractError):
    """A standard descriptor changed during a call that overlapped other plugins' calls: the culprit is
    one of them, not certainly this one (detecting each alone names it)."""


_running: set[PluginCall[object]] = set()
_running_lock = threading.Lock()


def _join_running(call: PluginCall[object]) -> None:
    """Count ``call`` as running; it and every call already running have overlapped."""
    with _running_lock:
        for other in _running:
            other._beside.add(call.candidate.name)
            call._beside.add(other.candidate.name)
        _running.add(call)


def _leave_running(call: PluginCall[object]) -> None:
    with _running_lock:
        _running.discard(call)


def call_plugin(
    candidate: Candidate,
    step: str,
    fn: Callable[[], T],
    timeout: float,
    *,
    error: type[PluginError] = PluginError,
    fix: str = "",
    verb: str = "raised",
    limit: str = ENV_DETECT_TIMEOUT,
) -> T:
    """Run ``fn()`` as plugin code: in its own bounded thread, or inline when already inside one.

    ``step`` names it in errors (``"hook detect_platform"``); a raised exception becomes
    ``error`` with the message ``"<step> <verb> <exception>. Fix: <fix>"``; ``limit`` is the
    environment variable ``timeout`` was read from.
    """
    outer: PluginCall[object] | None = getattr(_current, "call", None)
    if outer is None:
        return PluginCall(candidate, step, fn, timeout, error=error, fix=fix, verb=verb, limit=limit).result()
    previous, outer.step = outer.step, step
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001 - same isolation as a call of its own
        raise blame(candidate, step, exc, error, fix, verb) from exc
    outer.step = previous
    return value


_STANDARD_STREAMS = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


_reopening = threading.Lock()


def _file_of(fd: int) -> tuple[int, int] | None:
    """The (device, inode) of the file open on ``fd``; None when it is closed."""
    try:
        found = os.fstat(fd)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _stream_files() -> tuple[tuple[int, int] | None, ...]:
    return tuple(_file_of(fd) for fd, _ in _STANDARD_STREAMS)


def _check_standard_streams(before: tuple[tuple[int, int] | None, ...]) -> list[str]:
    """The standard descriptors that were open on one file before a call and are closed or on another
    file now; a closed one is opened again on /dev/null (one closed before the call too, unblamed)."""
    disturbed = []
    with _reopening:
        for (fd, label), was in zip(_STANDARD_STREAMS, before):
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
        return PluginContractError(candidate.name, candidate.distribution, f"{step} built a bad record: {raised}")
    if isinstance(raised, FdPlatformsError):
        return raised
    return error(
        candidate.name, candidate.distribution, f"{step} {verb} {describe(raised)}" + (f". Fix: {fix}" if fix else "")
    )


def describe(raised: BaseException) -> str:
    """``OSError: driver mismatch``; ``SystemExit(3)`` and ``KeyboardInterrupt()`` as written; never raises."""
    try:
        text = str(raised) if isinstance(raised, Exception) else ""
        return f"{type(raised).__name__}: {text}" if text else show_value(raised)
    except Exception:  # a plugin's exception whose str() fails still gets reported
        return type(raised).__name__


def _settle_paddle(had_paddle: bool) -> None:
    """Paddle imported in a plugin's thread leaves the importing thread in dynamic (eager) mode and
    the caller's thread in static-graph mode; give the caller the mode a plain import gives."""
    if had_paddle or "paddle" not in sys.modules:
        return
    paddle = sys.modules["paddle"]
    in_dynamic_mode = getattr(paddle, "in_dynamic_mode", None)
    if in_dynamic_mode is not None and not in_dynamic_mode():
        paddle.disable_static()
