"""What every child process of a run does around its body: signals, logging, errors sent to the engine.

Children ignore SIGINT from their start (:mod:`.interrupts`): on Ctrl-C the engine stops them.
SIGTERM (the engine's stop) becomes ``SystemExit(143)``, so a child releases what it holds and
exits without a traceback (paddle's import, which installs a C++ SIGTERM handler, keeps it:
:func:`~fd_platforms.contract.paddle_import.import_paddle`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from ..contract.errors import FdPlatformsError
from ..ipc.cache_signal import ENV_TIMEOUT
from ..ipc.timeouts import set_by_flag
from ..loading.platform import Platform
from ..loading.selection import ENV_PLATFORM, select_platform
from .interrupts import STOPPED_EXIT, ignore_sigint_in_child, raise_outside_paddle, redeliver_swallowed_signals
from .progress import Progress
from .spec import RunSpec

#: A child's body: ``body(conn, say, *args)``.
Body = Callable[..., None]

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_child(label: str, conn: Connection, spec: RunSpec, body: Body, *args: Any) -> None:
    """Run ``body``; a failure goes to the engine as ``("error", (type, message, exit code))``.

    The process then ends through :func:`leave`, never through interpreter teardown.
    """
    try:
        _run(label, conn, spec, body, *args)
    except SystemExit as exc:
        leave(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))
    leave(0)


def leave(code: int) -> None:
    """End this child: the exit hooks run (``weakref.finalize`` releases what it still holds, logging
    flushes), then ``os._exit``. Interpreter teardown is skipped: a call abandoned by the stop may still
    be inside Paddle's native code in a daemon thread (a collective call, :mod:`fd_platforms.engine.bounded`),
    and tearing the interpreter down under it ends in a C++ abort and a "C++ Traceback" on stderr
    (seen when SIGTERM came mid-export while plugin calls ran in threads of their own)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _run(label: str, conn: Connection, spec: RunSpec, body: Body, *args: Any) -> None:
    ignore_sigint_in_child()
    redeliver_swallowed_signals()
    signal.signal(signal.SIGTERM, _stop)
    _stop_with_the_engine()
    set_by_flag(ENV_TIMEOUT, "--timeout", spec.timeout)  # every bound here follows run --timeout, and says so
    logging.basicConfig(level=logging.WARNING, format="fd-platforms: %(levelname)s: %(message)s")
    if not spec.quiet:
        logging.getLogger("fd_platforms.ipc.cache_signal").setLevel(logging.INFO)  # the wait's 5 s progress
    say = Progress(spec.quiet, f"{label}: ")
    try:
        body(conn, say, *args)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        say("the engine process is gone; stopping")
        sys.exit(1)
    except FdPlatformsError as exc:
        _send_error(conn, type(exc).__name__, str(exc), exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - not ours: still one line for the engine, never a traceback
        _send_error(conn, type(exc).__name__, str(exc) or repr(exc), 1)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # exiting already: let the exit handlers finish
        conn.close()


def _stop_with_the_engine() -> None:
    """Have the kernel send this child SIGTERM (its stop) when the engine process ends, however it
    ends (SIGKILL included): a child inside a long wait (a creator waiting for its attacher's let-go,
    say) does not read the engine's pipe, and would otherwise hold its cache and FastDeploy's
    machine-wide names until its bound. ``prctl(PR_SET_PDEATHSIG)``; an engine already gone when it is
    set is a stop at once. A child of the fork server has that server for its parent, which ends when the engine
    does (at the end of its pipe from the engine), so the kernel's SIGTERM follows the engine's end one step later.
    Whether the engine is gone is read from the end of multiprocessing's pipe from it, which the kernel closes when
    the engine ends, however it is started."""
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not Linux's prctl: the engine's pipe still ends the child at its next request
    engine = multiprocessing.parent_process()
    if engine is not None and not engine.is_alive():
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def killed_with_the_parent() -> Iterator[None]:
    """Inside the block, this child's parent ending sends it SIGKILL, not SIGTERM: for a call into Paddle that waits
    holding the interpreter lock (joining a process group whose peer never comes), where no handler of ours can
    run. Nothing of the run's is held by then."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        yield
    finally:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _send_error(conn: Connection, kind: str, message: str, exit_code: int) -> None:
    with contextlib.suppress(OSError):  # the engine is gone; it will not read the error
        conn.send(("error", (kind, message, exit_code)))
    sys.exit(exit_code)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise_outside_paddle(signum, frame, SystemExit(STOPPED_EXIT))


def child_platform(spec: RunSpec) -> Platform:
    """The platform the engine selected, selected again here by name."""
    os.environ[ENV_PLATFORM] = spec.platform
    return select_platform().platform


def serve(conn: Connection, timeout: float, handlers: dict[str, Callable[[Any], Any]]) -> None:
    """Answer the engine's requests until ``("stop", None)``: each ``(kind, payload)`` gets
    ``(kind, handlers[kind](payload))``. At most ``timeout`` seconds between two requests."""
    while True:
        kind, payload = _receive(conn, timeout, f"nothing for {timeout:g} s")
        if kind == "stop":
            return
        if kind not in handlers:
            raise FdPlatformsError(f"unexpected request {kind!r} from the engine. Fix: report this as a bug")
        conn.send((kind, handlers[kind](payload)))


def expect(conn: Connection, kind: str, timeout: float) -> Any:
    """The payload of the engine's next message, which must be ``kind``, within ``timeout`` seconds."""
    got, payload = _receive(conn, timeout, f"no {kind!r} within {timeout:g} s")
    if got != kind:
        raise FdPlatformsError(f"expected {kind!r} from the engine, got {got!r}. Fix: report this as a bug")
    return payload


def _receive(conn: Connection, timeout: float, missing: str) -> Any:
    """The engine's next message, within ``timeout`` seconds; else an error saying the engine sent ``missing``."""
    if not conn.poll(timeout):
        raise FdPlatformsError(
            f"the engine sent {missing}. Fix: check the engine's output; "
            "raise --timeout if the run legitimately takes longer"
        )
    return conn.recv()
