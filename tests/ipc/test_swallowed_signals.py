"""A signal whose exception Python drops (raised inside a weakref callback or ``__del__``) still stops
the process: :func:`redeliver_swallowed_signals` sends it again, and nothing is printed.

Found by the 20x loop: a worker's SIGTERM (``SystemExit(143)``) raised while garbage collection ran
a ``WeakSet`` callback was printed as "Exception ignored" and the worker waited on until SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_helpers import ROOT

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

PROGRAM = """
import signal, sys, time, weakref
from fd_platforms.lifecycle.interrupts import (
    STOPPED_EXIT, Terminated, redeliver_swallowed_signals, sigint_says_stopping,
)

mode, signum = sys.argv[1], getattr(signal, sys.argv[2])
if mode == "fixed":
    redeliver_swallowed_signals()
if sys.argv[3] == "child":
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(STOPPED_EXIT)))
elif sys.argv[3] == "engine":
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(Terminated()))
stops = sigint_says_stopping() if sys.argv[3] == "ctrl-c" else None
if stops is not None:
    stops.__enter__()

class Thing:
    pass

thing = Thing()
ref = weakref.ref(thing, lambda _: signal.raise_signal(signum))  # the handler runs inside the callback
try:
    del thing
    time.sleep(3)
    print("survived", flush=True)
except KeyboardInterrupt:
    sys.exit(130)
except Terminated:
    sys.exit(143)
finally:
    print("cleanup", flush=True)
"""

CASES = [("SIGTERM", "child", 143), ("SIGTERM", "engine", 143), ("SIGINT", "default", 130), ("SIGINT", "ctrl-c", 130)]


def run(mode: str, signum: str, handler: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, signum, handler], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


@pytest.mark.parametrize(("signum", "handler", "code"), CASES)
def test_a_dropped_signal_exception_is_delivered_again(signum: str, handler: str, code: int) -> None:
    done = run("fixed", signum, handler)
    assert done.returncode == code, done.stderr
    assert done.stdout.split() == ["cleanup"], "stopped, with every finally run"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("signum", "handler", "code"), CASES[:1])
def test_without_it_python_drops_the_signal(signum: str, handler: str, code: int) -> None:
    done = run("plain", signum, handler)
    assert done.returncode == 0 and done.stdout.split() == ["survived", "cleanup"]
    assert "Exception ignored" in done.stderr
