"""Plugins are untrusted code: every call into one is isolated from every exception (SystemExit
included) and bounded in time. The plugins a command did not name are screened in a child process,
so a hang or an exit there only marks them broken; a call into the selected platform that runs past
its bound ends the process, naming the call; Ctrl-C still stops the command itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from run_helpers import QWEN, ROOT, SCRIPT

from fd_platforms.contract.errors import PlatformUnavailableError, PluginError, PluginLoadError, PluginTimeoutError
from fd_platforms.loading.selection import Prober, select_platform, survey
from fd_platforms.loading.watchdog import BACKSTOP_EXIT_STATUS, BACKSTOP_SECONDS, EXIT_STATUS

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"

HEADER = """
import os, sys, time
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

def mark(what):
    marker = os.environ.get("FD_TEST_MARKER")
    if marker:
        with open(marker, "a") as handle:
            handle.write(what + "\\n")

@hookimpl
def platform_identity():
    return PlatformIdentity(NAME, NAME + "_dev", None)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


def plugin(
    name: str, detect: str = "return Detection(True, 'present', 1)", module_level: str = "", confirm: str | None = None
) -> str:
    """A plugin module: ``detect`` and ``confirm`` are hook bodies, ``module_level`` runs at import."""
    source = f"NAME = {name!r}\n{HEADER}\n{module_level}\n@hookimpl\ndef detect_platform():\n    {detect}\n"
    if confirm is not None:
        source += f"\n@hookimpl\ndef confirm_platform():\n    {confirm}\n"
    return source


SLEEP_FOREVER = "mark('hanging'); time.sleep(3600)"
SPIN_FOREVER = "mark('spinning')\n    while True:\n        pass"
HOLD_THE_GIL = "import re; re.match(r'(a+)+$', 'a' * 64 + 'b')"  # catastrophic backtracking inside the C matcher


def cli(*args: str, site: Path, timeout: float = 120, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    environ.update(PYTHONPATH=str(site), **env)
    started = time.monotonic()
    done = subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=timeout)
    return done, time.monotonic() - started


def listed(done: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {p["name"]: p for p in json.loads(done.stdout)["platforms"]}


# -- hangs: bounded, the others go on, the process exits promptly ---------------------------------


@pytest.mark.parametrize(
    ("source", "step"),
    [
        (plugin("hangs", detect=SLEEP_FOREVER), "hook detect_platform"),
        (plugin("hangs", detect=SPIN_FOREVER), "hook detect_platform"),
        (plugin("hangs", detect=HOLD_THE_GIL), "hook detect_platform"),
        (plugin("hangs", module_level="time.sleep(3600)"), "importing 'fd_test_plugin_fd_test_hangs'"),
    ],
    ids=["detect-sleeps", "detect-spins", "detect-holds-the-gil", "import-sleeps"],
)
def test_list_marks_a_hanging_plugin_broken_and_returns(make_plugin, source: str, step: str) -> None:
    """The screening child ends by either watcher (the GIL-holding hook: faulthandler's C timer, exit status 1);
    the parent reads the step from the named frame in both."""
    site = make_plugin("hangs", source=source)
    done, seconds = cli("list", "--json", site=site, FD_PLATFORM_DETECT_TIMEOUT="1")
    assert done.returncode == 0, done.stderr
    assert seconds < 15, f"list took {seconds:.1f} s with a 1 s bound"
    platforms = listed(done)
    hung = platforms["hangs"]
    assert hung["status"] == "broken"
    assert f"{step} did not return within 1 s, so the plugin is marked broken" in hung["reason"]
    assert "FD_PLATFORM_DETECT_TIMEOUT" in hung["reason"]
    assert platforms["cpu"]["status"] == "available" and json.loads(done.stdout)["selected"]["name"] == "cpu"
    assert "Traceback" not in done.stderr


def test_each_hanging_plugin_costs_its_own_bound_and_the_others_are_still_screened(make_plugin) -> None:
    """The screening child detects one platform after another; a hang ends it, and a new child goes on."""
    make_plugin("hangone", source=plugin("hangone", detect=SLEEP_FOREVER))
    make_plugin("fine", source=plugin("fine"))
    site = make_plugin("hangtwo", source=plugin("hangtwo", module_level="time.sleep(3600)"))
    done, seconds = cli("list", "--json", site=site, FD_PLATFORM_DETECT_TIMEOUT="2")
    assert done.returncode == 0, done.stderr
    platforms = listed(done)
    assert {platforms[name]["status"] for name in ("hangone", "hangtwo")} == {"broken"}
    assert platforms["fine"]["status"] == "available", "the platform screened after a hang is still detected"
    assert seconds < 2 * 2 + 15, f"two hanging plugins took {seconds:.1f} s with a 2 s bound each"


def test_a_hanging_confirmation_falls_back_to_cpu_and_fails_a_selection_promptly(make_plugin) -> None:
    site = make_plugin("slowpaddle", source=plugin("slowpaddle", confirm=SLEEP_FOREVER))
    done, seconds = cli("list", "--json", site=site, FD_PLATFORM_DETECT_TIMEOUT="1")
    assert done.returncode == 0 and seconds < 15, done.stderr
    assert "hook confirm_platform did not return within 1 s" in listed(done)["slowpaddle"]["reason"]
    done, seconds = cli("list", site=site, FD_PLATFORM_DETECT_TIMEOUT="1", FD_PLATFORM="slowpaddle")
    assert done.returncode == 2 and seconds < 15
    assert done.stderr.splitlines()[-1].startswith("fd-platforms: error: platform plugin 'slowpaddle'")


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "--model", QWEN, "--device-memory", "1GiB"),
        ("run", "--model", QWEN, "--device-memory", "256MiB", "--timeout", "30"),
    ],
    ids=["plan", "run"],
)
def test_plan_and_run_go_on_without_a_hanging_plugin(make_plugin, args: tuple[str, ...]) -> None:
    site = make_plugin("hangs", source=plugin("hangs", detect=SLEEP_FOREVER))
    done, seconds = cli(*args, site=site, FD_PLATFORM_DETECT_TIMEOUT="1")
    assert done.returncode == 0, done.stderr
    assert seconds < 30 and "skipping broken platform plugin" in done.stderr


def test_ctrl_c_while_a_plugin_hangs_stops_the_command_with_130(make_plugin, tmp_path: Path) -> None:
    site = make_plugin("hangs", source=plugin("hangs", detect=SLEEP_FOREVER))
    marker = tmp_path / "marker"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    environ.update(PYTHONPATH=str(site), FD_PLATFORM_DETECT_TIMEOUT="600", FD_TEST_MARKER=str(marker))
    process = subprocess.Popen(
        [SCRIPT, "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, cwd=ROOT
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and "hanging" in marker.read_text()):
            assert time.monotonic() < deadline and process.poll() is None, "the plugin never started hanging"
            time.sleep(0.05)
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        stopped = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130 and stderr.splitlines()[-1] == "fd-platforms: interrupted", stderr
    assert "Traceback" not in stderr and stopped < 5


@pytest.mark.parametrize("raw", ["soon", "1e9", "-1", "nan"])
def test_a_bad_detection_bound_is_a_configuration_error(make_plugin, raw: str) -> None:
    site = make_plugin("fine", source=plugin("fine"))
    done, _ = cli("list", site=site, FD_PLATFORM_DETECT_TIMEOUT=raw)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert f"FD_PLATFORM_DETECT_TIMEOUT={raw!r} is not valid" in line and "Fix: set FD_PLATFORM_DETECT_TIMEOUT" in line
    assert "or to 0 for no bound" in line


def test_a_bad_allocation_bound_is_a_configuration_error(make_plugin) -> None:
    source = (
        plugin("fine") + "\n@hookimpl\ndef host_alloc(nbytes, require_pinned):\n    raise OSError('never called')\n"
    )
    site = make_plugin("fine", source=source)
    done, _ = python_api("platform.host_alloc(4096)", site=site, FD_PLATFORM="fine", FD_PLATFORM_ALLOC_TIMEOUT="-5")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "FD_PLATFORM_ALLOC_TIMEOUT='-5' is not valid" in done.stderr and "or to 0 for no bound" in done.stderr


# -- SystemExit, KeyboardInterrupt and friends: isolated -----------------------------------------


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (
            plugin("rude", module_level="raise SystemExit(3)"),
            "importing 'fd_test_plugin_fd_test_rude' failed: SystemExit(3)",
        ),
        (plugin("rude", module_level="sys.exit('bye')"), "failed: SystemExit('bye')"),
        (plugin("rude", detect="raise KeyboardInterrupt"), "hook detect_platform raised KeyboardInterrupt()"),
        (plugin("rude", detect="raise SystemExit(0)"), "hook detect_platform raised SystemExit(0)"),
        (plugin("rude", detect="raise GeneratorExit('odd')"), "hook detect_platform raised GeneratorExit('odd')"),
    ],
    ids=["import-exit-3", "import-sys-exit", "detect-ctrl-c", "detect-exit-0", "detect-generator-exit"],
)
def test_base_exceptions_from_a_plugin_mark_it_broken(make_plugin, source: str, words: str) -> None:
    site = make_plugin("rude", source=source)
    done, _ = cli("list", "--json", site=site)
    assert done.returncode == 0, done.stderr
    rude = listed(done)["rude"]
    assert rude["status"] == "broken" and words in rude["reason"], rude["reason"]
    assert "Traceback" not in done.stderr and json.loads(done.stdout)["selected"]["name"] == "cpu"


def test_selecting_a_plugin_that_exits_is_one_error_line(make_plugin) -> None:
    site = make_plugin("rude", source=plugin("rude", confirm="raise SystemExit(7)"))
    done, _ = cli("plan", "--model", QWEN, "--device-memory", "1GiB", site=site, FD_PLATFORM="rude")
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line == (
        "fd-platforms: error: platform plugin 'rude' (distribution fd-test-rude): "
        "hook confirm_platform raised SystemExit(7)"
    )


def test_a_hung_plugin_screened_in_a_child_is_an_error_naming_its_step_and_bound(make_plugin, monkeypatch) -> None:
    """The calling process survives: the child's watchdog ended the child, and its stack named the call."""
    monkeypatch.setenv("FD_PLATFORM_DETECT_TIMEOUT", "0.5")
    make_plugin("hangs", source=plugin("hangs", confirm=SLEEP_FOREVER))
    probe = Prober().probe_all(["hangs"])["hangs"]
    assert isinstance(probe.error, PluginTimeoutError)
    assert (probe.error.step, probe.error.seconds) == ("hook confirm_platform", 0.5)
    report = {r.name: r for r in survey({}).reports}["hangs"]
    assert report.status == "broken" and "hook confirm_platform did not return within 0.5 s" in report.reason


def test_a_screening_child_that_ends_outside_any_plugin_names_every_platform_it_did_not_reach(
    make_plugin, monkeypatch
) -> None:
    """Nothing to blame and nothing to learn by starting another such child: each platform says so."""
    make_plugin("one", source=plugin("one"))
    make_plugin("two", source=plugin("two"))
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits at once, before any plugin
    probes = Prober().probe_all(["one", "two"])
    for name in ("one", "two"):
        error = probes[name].error
        assert isinstance(error, PluginLoadError), probes[name]
        assert (
            "the child process that detects platforms ended before it reached this one (it exited with code 1)"
            in str(error)
        )
        assert "Fix: run the command again; if this repeats, set FD_PLATFORM" in str(error)


# -- the selected platform: calls in this process, a hang ends it ----------------------------------

API_SCRIPT = """
import sys, threading, time
from fd_platforms.contract.errors import FdPlatformsError
from fd_platforms.loading.selection import select_platform

threading.Thread(target=time.sleep, args=(3600,), name="engine-helper", daemon=True).start()
try:
    platform = select_platform().platform
    print("selected", flush=True)
    {call}
except FdPlatformsError as exc:
    print(f"error: {{exc}}", file=sys.stderr)
    sys.exit(exc.exit_code)
print("returned", flush=True)
"""


def python_api(
    call: str, *, site: Path, timeout: float = 120, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """An engine's process using the Python API: select the platform, then ``call`` (``platform`` is in scope)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    environ.update(PYTHONPATH=os.pathsep.join([str(site), *sys.path]), **env)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", API_SCRIPT.format(call=call)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        timeout=timeout,
    )
    return done, time.monotonic() - started


MEMORY_HOOK = "\n@hookimpl\ndef device_memory(device_id):\n    mark('hanging')\n    {body}\n"


def timed_out_line(plugin_name: str, step: str, seconds: str, variable: str) -> str:
    return (
        f"in fd-platforms: plugin {plugin_name!r} (distribution fd-test-{plugin_name}), {step}, "
        f"bound {seconds} s ({variable})"
    )


@pytest.mark.parametrize("how", ["plan", "python-api"])
@pytest.mark.parametrize("body", [HOLD_THE_GIL, "time.sleep(3600)"], ids=["holds-the-gil", "sleeps"])
def test_a_hook_past_its_bound_ends_the_process_naming_the_call(make_plugin, how: str, body: str) -> None:
    """A sleeping hook: our watchdog thread ends the process at the bound (exit status 124), after a line naming
    the call. A hook holding the interpreter lock keeps that thread out: faulthandler's C timer, set
    BACKSTOP_SECONDS past the deadline, ends it (exit status 1). Either way the stack names plugin, hook, bound
    and variable, and every thread's stack follows."""
    site = make_plugin("hangs", source=plugin("hangs") + MEMORY_HOOK.format(body=body))
    env = {"FD_PLATFORM": "hangs", "FD_PLATFORM_DETECT_TIMEOUT": "2"}
    if how == "plan":
        done, seconds = cli("plan", "--model", QWEN, site=site, **env)
    else:
        done, seconds = python_api("platform.device_memory(0)", site=site, **env)
    if body == HOLD_THE_GIL:
        assert done.returncode == BACKSTOP_EXIT_STATUS, (done.returncode, done.stderr[-3000:])
        assert re.search(r"^Timeout \(0:00:0\d(\.\d+)?\)!$", done.stderr, re.M), done.stderr[-3000:]
        assert 2 + BACKSTOP_SECONDS / 2 <= seconds < 2 + BACKSTOP_SECONDS + 8, f"ended after {seconds:.1f} s"
    else:
        assert done.returncode == EXIT_STATUS, (done.returncode, done.stderr[-3000:])
        assert "fd-platforms: a plugin call did not return within its bound, so it ends the process" in done.stderr
        assert 2 <= seconds < 2 + 8, f"ended after {seconds:.1f} s with a 2 s bound"
    assert timed_out_line("hangs", "hook device_memory", "2", "FD_PLATFORM_DETECT_TIMEOUT") in done.stderr
    assert re.search(r'File ".*fd_test_plugin_fd_test_hangs.py", line \d+ in device_memory', done.stderr)
    if how == "python-api":
        assert done.stdout.splitlines() == ["selected"]
        assert (
            len(re.findall(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):", done.stderr, re.M)) >= 2
        )


def test_an_allocation_hook_is_bounded_by_its_own_variable(make_plugin) -> None:
    """host_alloc may take long for a large cache: FD_PLATFORM_ALLOC_TIMEOUT bounds it, not the detection bound."""
    source = plugin("slowalloc") + "\n@hookimpl\ndef host_alloc(nbytes, require_pinned):\n    time.sleep(3600)\n"
    site = make_plugin("slowalloc", source=source)
    done, seconds = python_api(
        "platform.host_alloc(4096)",
        site=site,
        FD_PLATFORM="slowalloc",
        FD_PLATFORM_DETECT_TIMEOUT="30",
        FD_PLATFORM_ALLOC_TIMEOUT="1.5",
    )
    assert done.returncode == EXIT_STATUS and seconds < 1.5 + 8, done.stderr[-2000:]
    assert timed_out_line("slowalloc", "hook host_alloc", "1.5", "FD_PLATFORM_ALLOC_TIMEOUT") in done.stderr


def test_a_bound_of_0_turns_the_watchdog_off(make_plugin) -> None:
    """For an engine that bounds its calls itself, or uses faulthandler's one dump_traceback_later."""
    body = "time.sleep(2)\n    raise OSError('woke up')"
    site = make_plugin("slow", source=plugin("slow") + MEMORY_HOOK.format(body=body))
    done, seconds = python_api(
        "platform.device_memory(0)", site=site, FD_PLATFORM="slow", FD_PLATFORM_DETECT_TIMEOUT="0"
    )
    assert done.returncode == 2 and seconds >= 2, done.stderr[-2000:]
    assert "hook device_memory raised OSError: woke up" in done.stderr, "the hook ran to its end"


def test_a_hook_in_one_thread_keeps_its_bound_while_another_threads_call_ends(make_plugin) -> None:
    """Each thread's call has its own deadline: another thread's calls ending never end or move this one's."""
    source = plugin("threads") + MEMORY_HOOK.format(body="time.sleep(0.3 if device_id else 3600)\n    return None")
    site = make_plugin("threads", source=source)
    call = (
        "quick = threading.Thread(target=lambda: [platform.device_memory(1) for _ in range(20)])\n"
        "    quick.start(); platform.device_memory(0)"
    )
    done, seconds = python_api(call, site=site, FD_PLATFORM="threads", FD_PLATFORM_DETECT_TIMEOUT="3")
    assert done.returncode == EXIT_STATUS and "hook device_memory, bound 3 s" in done.stderr, done.stderr[-2000:]
    assert 3 <= seconds < 3 + 8, f"the hanging call ended the process after {seconds:.1f} s, its bound is 3 s"


def test_ctrl_c_during_a_hook_of_the_selected_platform_stops_the_command_with_130(make_plugin, tmp_path: Path) -> None:
    """The hook runs in the command's own thread: Ctrl-C interrupts it and stays the user's, not the plugin's."""
    site = make_plugin("hangs", source=plugin("hangs") + MEMORY_HOOK.format(body="time.sleep(3600)"))
    marker = tmp_path / "marker"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    environ.update(PYTHONPATH=str(site), FD_PLATFORM="hangs", FD_TEST_MARKER=str(marker))
    process = subprocess.Popen(
        [SCRIPT, "plan", "--model", QWEN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and "hanging" in marker.read_text()):
            assert time.monotonic() < deadline and process.poll() is None, "the hook never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130 and stderr.splitlines()[-1] == "fd-platforms: interrupted", stderr


def test_paddle_imported_by_a_hook_leaves_the_caller_in_eager_mode(make_plugin) -> None:
    """Paddle's mode is per thread; the hook ran in the caller's, so the caller has paddle's own default."""
    site = make_plugin("paddly", source=plugin("paddly", confirm="import paddle\n    return None"))
    call = "import paddle; assert paddle.in_dynamic_mode(); print(type(paddle.ones([2]).sum()).__name__)"
    done, _ = python_api(call, site=site, FD_PLATFORM="paddly")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["selected", "Tensor", "returned"]


class EngineStop(Exception):
    """What an engine's own signal handler raises."""


@pytest.mark.parametrize("raised", [EngineStop("stop"), SystemExit(143)], ids=["an-exception", "system-exit"])
def test_what_the_engines_signal_handler_raises_inside_a_hook_stays_the_engines(make_plugin, raised) -> None:
    """Python runs signal handlers in the main thread wherever it is, a hook's code included: what the
    engine's handler raises there is the engine's stop, not the plugin's error."""
    make_plugin("slowmem", source=plugin("slowmem") + MEMORY_HOOK.format(body="time.sleep(10)"))
    platform = select_platform({"FD_PLATFORM": "slowmem"}).platform

    def stop(signum: int, frame: object) -> None:
        raise raised

    previous = signal.signal(signal.SIGUSR1, stop)
    sender = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        sender.start()
        with pytest.raises(type(raised)) as caught:
            platform.device_memory(0)
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, previous)
    assert caught.value is raised


def test_a_keyboard_interrupt_from_the_selected_plugin_stays_a_keyboard_interrupt(make_plugin) -> None:
    make_plugin("ctrlc", source=plugin("ctrlc", confirm="raise KeyboardInterrupt"))
    with pytest.raises(KeyboardInterrupt):
        select_platform({"FD_PLATFORM": "ctrlc"})


def test_system_exit_from_the_selected_plugin_is_its_error(make_plugin) -> None:
    make_plugin("quits", source=plugin("quits", confirm="raise SystemExit(4)"))
    with pytest.raises(PluginError, match=r"hook confirm_platform raised SystemExit\(4\)"):
        select_platform({"FD_PLATFORM": "quits"})


def test_an_import_error_still_reads_as_before(make_plugin) -> None:
    make_plugin("broken", source="raise RuntimeError('vendor SDK too old')\n")
    with pytest.raises(
        PluginLoadError, match=r"importing '.*' failed: RuntimeError: vendor SDK too old\. Fix: reinstall"
    ):
        select_platform({"FD_PLATFORM": "broken"})


def test_a_hook_error_keeps_its_type_and_message(make_plugin) -> None:
    make_plugin("oserr", source=plugin("oserr", confirm="raise OSError('driver mismatch')"))
    with pytest.raises(PluginError, match="hook confirm_platform raised OSError: driver mismatch"):
        select_platform({"FD_PLATFORM": "oserr"})
    make_plugin("down", source=plugin("down", detect="return Detection(False, 'no device here', 0)"))
    with pytest.raises(PlatformUnavailableError, match="no device here"):
        select_platform({"FD_PLATFORM": "down"})
