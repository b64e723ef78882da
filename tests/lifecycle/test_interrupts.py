"""The engine's Ctrl-C around starting children (:mod:`fd_platforms.lifecycle.interrupts`): never lost by the
engine, never acted on by a child."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from multiprocessing.connection import Connection

import pytest

from fd_platforms.lifecycle.interrupts import ignore_sigint_in_child, sigint_ignored_by_children

# A Ctrl-C (process-directed, as the terminal sends it) while the engine starts a child, with a second
# thread that does not block SIGINT (the engine has them: watchdogs, pipe readers, Paddle's).
CTRL_C_WHILE_STARTING = textwrap.dedent(
    """
    import os, signal, threading, time
    from fd_platforms.lifecycle.interrupts import sigint_ignored_by_children
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    try:
        with sigint_ignored_by_children():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("inside, not yet raised", flush=True)
        time.sleep(0.5)
        print("lost")
    except KeyboardInterrupt:
        print("raised after the block")
    """
)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_ctrl_c_while_a_child_starts_is_raised_after_it_not_dropped_by_another_thread() -> None:
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_STARTING], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["inside, not yet raised", "raised after the block"], done.stderr


def _report_start_then_ignore(conn: Connection) -> None:
    conn.send(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    conn.recv()  # the parent has sent this child a SIGINT meanwhile: still blocked, so pending
    ignore_sigint_in_child()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    conn.send((signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.SIGINT in blocked))


@pytest.mark.slow
def test_a_child_starts_with_sigint_blocked_and_then_ignores_it_discarding_one_sent_meanwhile() -> None:
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("spawn").Process(target=_report_start_then_ignore, args=(theirs,))
    with sigint_ignored_by_children():
        child.start()
    try:
        assert ours.poll(60) and ours.recv() is True, "SIGINT blocked from the child's first line"
        assert child.pid is not None
        os.kill(child.pid, signal.SIGINT)
        ours.send("go")
        assert ours.poll(60) and ours.recv() == (True, False), "ignored, then unblocked"
        child.join(30)
        assert child.exitcode == 0, "the SIGINT sent during start-up did not end the child"
    finally:
        child.kill()
        child.join()
