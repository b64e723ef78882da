"""The engine's child processes: start them (spawned, or forked from a fork server that imported Paddle once:
:data:`START_METHOD_ENV`) or adopt them (a launcher's), collect one message from each, stop them all.

Every wait here is bounded. A child that dies without a message is a failure naming it and how
it ended; after the first failure of a phase the others get :data:`FAILURE_GRACE` seconds to
report theirs, so one error message tells what happened to every process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from types import TracebackType
from typing import Any, Protocol

from ..contract.errors import ConfigError, RunError
from ..ipc.process_watch import describe_exit
from .interrupts import sigint_ignored_by_children

FAILURE_GRACE = 2.0  #: seconds the rest of a phase may still report after its first failure
STOP_SECONDS = 5.0  # seconds children get to exit after "stop" or SIGTERM, before SIGKILL
CAUSE_SECONDS = 0.5  # how long a failed phase waits, in all, for a child outside it that is still exiting

START_METHOD_ENV = "FD_PLATFORMS_START_METHOD"
"""How ``run`` starts its children. ``spawn`` (the default): each is a fresh interpreter that imports Paddle itself.
``forkserver``: one fork server imports Paddle once (``fd_platforms.lifecycle.warm``), before any device is touched,
and forks every child; it saves a Paddle import per child, but each child then runs in a copy of a process in which
Paddle, and any vendor runtime Paddle's import loads (custom devices load theirs then), has already loaded: measured
on the cpu build only."""
START_METHODS = ("spawn", "forkserver")
WARM_MODULE = "fd_platforms.lifecycle.warm"  #: what the fork server imports before it forks any child


def start_method(environ: Mapping[str, str] = os.environ) -> str:
    """The start method :data:`START_METHOD_ENV` names (``spawn`` where unset); a ConfigError naming it otherwise."""
    method = environ.get(START_METHOD_ENV) or "spawn"
    if method not in START_METHODS:
        raise ConfigError(
            START_METHOD_ENV,
            method,
            " or ".join(START_METHODS),
            f"unset {START_METHOD_ENV} (spawn), or set it to forkserver to fork every child from one process that "
            "imported Paddle",
        )
    return method


class Process(Protocol):
    """What the engine uses of a process: a spawned one, or a worker Paddle's launcher started (:mod:`.launcher`)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def sentinel(self) -> int: ...
    @property
    def exitcode(self) -> int | None: ...
    def join(self, timeout: float | None = None) -> None: ...
    def is_alive(self) -> bool: ...
    def terminate(self) -> None:
        """SIGTERM, then SIGCONT: a stopped process handles its SIGTERM (cleans up) at once, not after SIGKILL."""

    def kill(self) -> None: ...


class _Continued(multiprocessing.process.BaseProcess):
    """A started child whose :meth:`terminate` also continues it (:meth:`Process.terminate`)."""

    def terminate(self) -> None:
        super().terminate()
        if self.exitcode is None and self.pid is not None:  # not reaped: the pid is still this child's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)


class _Spawned(_Continued, multiprocessing.context.SpawnProcess):
    """A spawned child."""


class _Forked(_Continued, multiprocessing.context.ForkServerProcess):
    """A child forked by the fork server (its parent process; the engine still reads its end through the server)."""


_STARTED = {"spawn": _Spawned, "forkserver": _Forked}


@dataclass(eq=False)
class Child:
    """One child process and the engine's end of its pipe."""

    label: str
    process: Process
    conn: Connection

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def ended(self) -> str:
        """How it ended, in words (a launched worker's exit code is its launcher's, not the engine's, to read)."""
        code = self.process.exitcode
        return "ended" if code is None and not self.process.is_alive() else describe_exit(code)


class Children(contextlib.AbstractContextManager["Children"]):
    """Child processes of one run; leaving the ``with`` block stops every one of them."""

    def __init__(self, method: str = "spawn") -> None:
        self.started: list[Child] = []
        self._process = _STARTED[method]
        if method == "forkserver":  # this process is the run's engine: the fork server is its own
            multiprocessing.set_forkserver_preload([WARM_MODULE])

    def start(self, label: str, target: Callable[..., None], *args: Any) -> Child:
        """Start ``target(*args, conn)`` in a new process labelled ``label``, as the start method says."""
        ours, theirs = multiprocessing.Pipe()
        process = self._process(target=target, args=(*args, theirs), name=label, daemon=True)
        with sigint_ignored_by_children():  # a Ctrl-C now is raised once the child is counted
            process.start()
            theirs.close()
            return self.adopt(label, process, ours)

    def adopt(self, label: str, process: Process, conn: Connection) -> Child:
        """Count ``process``, started elsewhere, among this run's children, ``conn`` its pipe."""
        child = Child(label, process, conn)
        self.started.append(child)
        return child

    def send(self, children: Sequence[Child], kind: str, payload: Any = None) -> None:
        """Send ``(kind, payload)`` to each child; one that is gone is reported by the next collect."""
        for child in children:
            with contextlib.suppress(OSError):
                child.conn.send((kind, payload))

    def collect(self, children: Sequence[Child], kind: str, timeout: float) -> dict[Child, Any]:
        """The payload of each child's next message, which must be ``kind``;
        :class:`~fd_platforms.contract.errors.RunError` otherwise.

        Fails when a child reports an error, dies, or sends nothing within ``timeout`` seconds;
        failures are listed in the order of ``children``, and the first one's exit code is the error's.
        """
        deadline = time.monotonic() + timeout
        waiting = list(children)
        got: dict[Child, Any] = {}
        failed: dict[Child, tuple[str, int]] = {}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            handles: dict[Any, Child] = {c.conn: c for c in waiting} | {c.process.sentinel: c for c in waiting}
            for handle in wait(list(handles), timeout=remaining):
                child = handles[handle]
                if child not in waiting:
                    continue  # its pipe and its sentinel were both ready
                waiting.remove(child)
                message = self._receive(child)
                if message is not None and message[0] == kind:
                    got[child] = message[1]
                    continue
                if not failed:
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
                failed[child] = self._failure(child, kind, message)
        if not failed:
            for child in waiting:
                failed[child] = (
                    (
                        f"sent no {kind!r} within {timeout:g} s (pid {child.pid} still running). "
                        "Fix: raise --timeout if this phase legitimately takes longer"
                    ),
                    1,
                )
        if failed:
            ordered = [child for child in children if child in failed]
            causes = self._ended_outside(children)  # e.g. the cache manager, whose death failed a worker's attach
            reports = tuple((c.label, failed[c][0]) for c in ordered)
            raise RunError((*causes, *reports), 1 if causes else failed[ordered[0]][1])
        return got

    def _ended_outside(self, children: Sequence[Child]) -> tuple[tuple[str, str], ...]:
        """Children outside this phase that have ended unasked (waiting :data:`CAUSE_SECONDS` at most for one
        still exiting): named first, as the likely cause of the phase's failures, with exit code 1."""
        deadline = time.monotonic() + CAUSE_SECONDS
        ended = []
        for child in self.started:
            if child in children:
                continue
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.exitcode not in (None, 0):
                died = describe_exit(child.process.exitcode)
                ended.append((child.label, f"pid {child.pid} {died} during this phase"))
        return tuple(ended)

    def _receive(self, child: Child) -> tuple[str, Any] | None:
        """The child's next message, or None when it has closed its pipe (it ended)."""
        if not child.conn.poll(0):
            return None  # only the sentinel was ready: it ended without a message
        try:
            return child.conn.recv()
        except (EOFError, OSError):
            return None

    def _failure(self, child: Child, kind: str, message: tuple[str, Any] | None) -> tuple[str, int]:
        """(what happened, exit code) for a child that did not send ``kind``."""
        if message is None:
            child.process.join(STOP_SECONDS)
            return f"pid {child.pid} {child.ended()} before sending its {kind!r}", 1
        if message[0] == "error":
            error_type, text, code = message[1]
            return f"{error_type}: {text}", code
        return f"sent {message[0]!r} where {kind!r} was expected. Fix: report this as a bug", 1

    def stop(self, graceful: bool) -> None:
        """Stop every child: a ``stop`` message when ``graceful``, then SIGTERM, then SIGKILL, each with a timeout."""
        if graceful:
            self.send(self.started, "stop")
            self._join_all()
        for child in self.started:
            if child.process.is_alive():
                child.process.terminate()
        self._join_all()
        for child in self.started:
            if child.process.is_alive():
                child.process.kill()
                child.process.join(STOP_SECONDS)
        for child in self.started:
            child.conn.close()

    def _join_all(self) -> None:
        deadline = time.monotonic() + STOP_SECONDS
        for child in self.started:
            child.process.join(max(0.0, deadline - time.monotonic()))

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop(graceful=kind is None)
