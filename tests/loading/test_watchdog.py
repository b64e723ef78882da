"""The bound on plugin calls in an engine's own process: no signal handler or timer of ours, so an engine's
SIGALRM handler and interval timer stay its own; a hung hook still ends the process, naming the call; a fork
after a call leaves the child able to make bounded calls of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from run_helpers import ROOT

from fd_platforms.loading.watchdog import EXIT_STATUS

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

PLUGIN = """
import time
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, DeviceMemory, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("engine", "engine_dev", None)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def detect_platform():
    return Detection(True, "present", 1)

@hookimpl
def device_memory(device_id):
    if device_id == 7:
        print("hanging", flush=True)
        {hang}
    return DeviceMemory(total_bytes=2**30, free_bytes=2**29, process_bytes=0, source="test")
"""

ENGINE = """
import signal, sys, time
from fd_platforms.loading.selection import select_platform

ticks = []
def engine_handler(signum, frame):
    ticks.append(signum)

signal.signal(signal.SIGALRM, engine_handler)
signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
platform = select_platform().platform
for _ in range(200):
    platform.device_memory(0)
platform.declared_limits()
{after}
signal.setitimer(signal.ITIMER_REAL, 0)  # a timer left running would fire into SIG_DFL at interpreter exit
"""

KEPT = """
print("handler", signal.getsignal(signal.SIGALRM) is engine_handler)
print("interval", signal.getitimer(signal.ITIMER_REAL)[1])
before = len(ticks)
time.sleep(0.5)
print("ticks", len(ticks) - before)
"""

FORKED = """
import os
pid = os.fork()
if pid == 0:
    time.sleep(3)  # past the point where a call sets faulthandler's C timer again
    platform.device_memory(0)
    platform.device_memory(7)
    os._exit(0)
started = time.monotonic()
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), round(time.monotonic() - started))
"""

SPIN = "while True:\n            pass"


COVERAGE_VARIABLE = "COVERAGE_PROCESS_CONFIG"
"""Set where the suite runs under coverage (``patch = subprocess``): a Python started with it measures itself."""


def engine(
    make_plugin, after: str, hang: str = "pass", timeout: float = 60, *, measured: bool = True, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """An engine's process with its own SIGALRM handler and a running 50 ms interval timer: it selects the
    plugin, calls hooks, then runs ``after``. ``measured=False``: never under coverage, whose patched ``os._exit``
    writes its data first, in our thread, against a hook that spins holding the interpreter lock: past the
    backstop's 5 s, so faulthandler's timer, not our thread, would end it."""
    site = make_plugin("engine", source=PLUGIN.format(hang=hang))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_") and (measured or k != COVERAGE_VARIABLE)}
    environ.update(PYTHONPATH=os.pathsep.join([str(site), *sys.path]), FD_PLATFORM="engine", **env)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", ENGINE.format(after=after)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def test_an_engines_sigalrm_handler_and_timer_stay_its_own(make_plugin) -> None:
    """The calls run (no refusal), and afterwards the handler is the engine's and its timer still fires into it."""
    done, _ = engine(make_plugin, KEPT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["handler"] == "True" and float(lines["interval"]) == pytest.approx(0.05), done.stdout
    assert int(lines["ticks"]) >= 5, f"the engine's timer fired {lines['ticks']} times in 0.5 s at 50 ms"


@pytest.mark.parametrize("hang", [SPIN, "time.sleep(3600)"], ids=["spins", "sleeps"])
def test_a_hung_hook_in_an_engine_with_its_own_sigalrm_ends_it_within_its_bound(make_plugin, hang: str) -> None:
    """The engine's timer keeps firing into its own handler all along; our thread ends the process at the bound."""
    done, seconds = engine(
        make_plugin, "platform.device_memory(7)", hang=hang, measured=hang != SPIN, FD_PLATFORM_DETECT_TIMEOUT="2"
    )
    assert done.returncode == EXIT_STATUS, (done.returncode, done.stderr[-3000:])
    assert 2 <= seconds < 2 + 8, f"ended after {seconds:.1f} s with a 2 s bound"
    assert done.stdout.splitlines() == ["hanging"]
    assert (
        "in fd-platforms: plugin 'engine' (distribution fd-test-engine), hook device_memory, "
        "bound 2 s (FD_PLATFORM_DETECT_TIMEOUT)" in done.stderr
    ), done.stderr[-3000:]
    assert "did not return within its bound, so it ends the process (exit status 124)" in done.stderr


def test_a_child_forked_after_a_call_makes_bounded_calls_of_its_own(make_plugin) -> None:
    """faulthandler's C timer, still set after the parent's calls, is not carried into the child (which could
    never set it again) and the child gets a watchdog thread of its own: its calls run, and its hung one ends it."""
    done, _ = engine(make_plugin, FORKED, hang="time.sleep(3600)", timeout=60, FD_PLATFORM_DETECT_TIMEOUT="2")
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    child = done.stdout.splitlines()[-1].split()
    assert child[:2] == ["child", str(EXIT_STATUS)] and 3 + 2 <= int(child[2]) < 3 + 2 + 8, (child, done.stderr[-2000:])
    assert "hook device_memory, bound 2 s (FD_PLATFORM_DETECT_TIMEOUT)" in done.stderr


def test_the_parent_of_a_fork_keeps_the_bound_of_a_call_running_in_another_thread(make_plugin) -> None:
    """A fork while a call hangs in another thread: the parent's watchers still end that call at its bound."""
    after = (
        "import os, threading\n"
        "threading.Thread(target=platform.device_memory, args=(7,)).start()\n"
        "time.sleep(0.5)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "time.sleep(3600)\n"
    )
    done, seconds = engine(make_plugin, after, hang="time.sleep(3600)", FD_PLATFORM_DETECT_TIMEOUT="2")
    assert done.returncode == EXIT_STATUS and 2 <= seconds < 2 + 8, (done.returncode, seconds, done.stderr[-2000:])
