"""A run's child stops on SIGTERM by raising ``SystemExit(143)`` from its handler, which runs in the main
thread wherever it is. Inside Paddle's Python code that Paddle's C++ called back (a tensor's constructor,
reached from ``paddle.from_dlpack`` in a cache tensor's export) the exception unwinds into C++ that cannot
carry it, and the process aborts with a C++ traceback: seen 2 times in 50 SIGTERMs to a loaded run once
exports ran in the child's main thread. The stop is delivered again once Paddle's code has returned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from run_helpers import ROOT

from fd_platforms.lifecycle import interrupts

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

PROGRAM = """
import os, signal, sys, time
import paddle
from fd_platforms.lifecycle.interrupts import STOPPED_EXIT, raise_outside_paddle

signal.signal(signal.SIGTERM, lambda signum, frame: raise_outside_paddle(signum, frame, SystemExit(STOPPED_EXIT)))
inside = {}
source = (
    "import os, signal, time\\n"
    "def callback():\\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\\n"
    "    until = time.monotonic() + 0.5\\n"
    "    while time.monotonic() < until:\\n"
    "        pass\\n"
    "    print('leaving Paddle code', flush=True)\\n"
)
exec(compile(source, os.path.join(os.path.dirname(paddle.__file__), "callback_from_cpp.py"), "exec"), inside)
try:
    inside["callback"]()  # as Paddle's C++ would call it: an exception must not leave it
except SystemExit:
    print("raised inside Paddle's code", flush=True)
    raise
time.sleep(5)  # the stop comes once Paddle's code has returned: any time from here, even before a print here
print("never stopped", flush=True)
"""


def test_a_stop_inside_paddles_code_is_raised_once_that_code_has_returned() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.stdout.splitlines() == ["leaving Paddle code"], done.stdout + done.stderr
    assert done.returncode == interrupts.STOPPED_EXIT, done.stderr


def test_outside_paddles_code_the_stop_is_raised_at_once(monkeypatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr(interrupts, "_send_again", lambda signum, **_: sent.append(signum))
    with pytest.raises(SystemExit) as stopped:
        interrupts.raise_outside_paddle(signal.SIGTERM, sys._getframe(), SystemExit(interrupts.STOPPED_EXIT))
    assert stopped.value.code == interrupts.STOPPED_EXIT and sent == []
