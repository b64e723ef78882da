"""Plugins are untrusted code: every call into one is bounded in time and isolated from every
exception (SystemExit and KeyboardInterrupt included); the others go on, the process exits promptly,
and Ctrl-C still stops the command itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fd_platforms.contract.errors import PlatformUnavailableError, PluginError, PluginLoadError, PluginTimeoutError
from fd_platforms.loading.selection import select_platform, survey
from run_helpers import QWEN, ROOT, SCRIPT

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


def plugin(name: str, detect: str = "return Detection(True, 'present', 1)", module_level: str = "",
           confirm: str | None = None) -> str:  # fmt: skip
    """A plugin module: ``detect`` and ``confirm`` are hook bodies, ``module_level`` runs at import."""
    source = f"NAME = {name!r}\n{HEADER}\n{module_level}\n@hookimpl\ndef detect_platform():\n    {detect}\n"
    if confirm is not None:
        source += f"\n@hookimpl\ndef confirm_platform():\n    {confirm}\n"
    return source


SLEEP_FOREVER = "mark('hanging'); time.sleep(3600)"
SPIN_FOREVER = "mark('spinning')\n    while True:\n        pass"


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
        (plugin("hangs", module_level="time.sleep(3600)"), "importing 'fd_test_plugin_fd_test_hangs'"),
    ],
    ids=["detect-sleeps", "detect-spins", "import-sleeps"],
)
def test_list_marks_a_hanging_plugin_broken_and_returns(make_plugin, source: str, step: str) -> None:
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


def test_hanging_plugins_cost_one_bound_together(make_plugin) -> None:
    make_plugin("hangone", source=plugin("hangone", detect=SLEEP_FOREVER))
    site = make_plugin("hangtwo", source=plugin("hangtwo", module_level="time.sleep(3600)"))
    done, seconds = cli("list", "--json", site=site, FD_PLATFORM_DETECT_TIMEOUT="5")
    assert done.returncode == 0, done.stderr
    assert {listed(done)[name]["status"] for name in ("hangone", "hangtwo")} == {"broken"}
    assert seconds < 2 * 5, f"two hanging plugins took {seconds:.1f} s: they were waited for one after the other"


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
        ("run", "--model", QWEN, "--device-memory", "256MiB", "--timeout", "5"),
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
    process = subprocess.Popen([SCRIPT, "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environ, cwd=ROOT)  # fmt: skip
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


@pytest.mark.parametrize("raw", ["0", "soon", "1e9", "-1"])
def test_a_bad_detection_bound_is_a_configuration_error(make_plugin, raw: str) -> None:
    site = make_plugin("fine", source=plugin("fine"))
    done, _ = cli("list", site=site, FD_PLATFORM_DETECT_TIMEOUT=raw)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert f"FD_PLATFORM_DETECT_TIMEOUT={raw!r} is not valid" in line and "Fix: set FD_PLATFORM_DETECT_TIMEOUT" in line


# -- SystemExit, KeyboardInterrupt and friends: isolated -----------------------------------------


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (plugin("rude", module_level="raise SystemExit(3)"), "importing 'fd_test_plugin_fd_test_rude' failed: SystemExit(3)"),
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


# -- in process -----------------------------------------------------------------------------------


def test_in_process_selection_reports_the_step_and_the_bound(make_plugin, monkeypatch) -> None:
    monkeypatch.setenv("FD_PLATFORM_DETECT_TIMEOUT", "0.5")
    make_plugin("hangs", source=plugin("hangs", confirm=SLEEP_FOREVER))
    with pytest.raises(PluginTimeoutError) as info:
        select_platform({"FD_PLATFORM": "hangs"})
    assert (info.value.step, info.value.seconds) == ("hook confirm_platform", 0.5)
    report = {r.name: r for r in survey({}).reports}["hangs"]
    assert report.status == "broken" and "did not return within 0.5 s" in report.reason


def test_a_platform_that_timed_out_once_is_broken_for_every_later_call(make_plugin, monkeypatch) -> None:
    monkeypatch.setenv("FD_PLATFORM_DETECT_TIMEOUT", "0.5")
    source = plugin("flaky") + (
        "\n_calls = []\n@hookimpl\ndef device_memory(device_id):\n"
        "    _calls.append(device_id)\n    time.sleep(3600 if len(_calls) == 1 else 0)\n"
    )
    make_plugin("flaky", source=source)
    platform = select_platform({"FD_PLATFORM": "flaky"}).platform
    with pytest.raises(PluginTimeoutError, match="hook device_memory did not return within 0.5 s"):
        platform.device_memory(0)
    started = time.monotonic()
    with pytest.raises(PluginTimeoutError) as again:
        platform.detect()
    assert time.monotonic() - started < 0.5 and again.value is platform.broken, "not another 0.5 s bound"


def test_each_timeout_names_the_variable_that_set_its_bound(make_plugin, monkeypatch) -> None:
    """A rule hook is bounded by FD_PLATFORM_DETECT_TIMEOUT, an allocation by FD_CACHE_READY_TIMEOUT:
    the error sends the user to the one that would change the bound."""
    monkeypatch.setenv("FD_PLATFORM_DETECT_TIMEOUT", "30")
    monkeypatch.setenv("FD_CACHE_READY_TIMEOUT", "0.5")
    source = plugin("slowalloc") + (
        "\n@hookimpl\ndef host_alloc(nbytes, require_pinned):\n    time.sleep(3600)\n"
    )
    make_plugin("slowalloc", source=source)
    platform = select_platform({"FD_PLATFORM": "slowalloc"}).platform
    with pytest.raises(PluginTimeoutError) as info:
        platform.host_alloc(4096)
    message = str(info.value)
    assert "hook host_alloc did not return within 0.5 s" in message, message
    assert "raise FD_CACHE_READY_TIMEOUT (seconds)" in message and "FD_PLATFORM_DETECT_TIMEOUT" not in message


def test_paddle_imported_by_a_plugin_thread_leaves_the_caller_in_eager_mode(make_plugin) -> None:
    """Paddle's mode is per thread: imported in a plugin's thread, the caller would get static graphs."""
    make_plugin("paddly", source=plugin("paddly", confirm="import paddle\n    return None"))
    code = (
        "import fd_platforms.loading.selection as s, sys\n"
        "assert 'paddle' not in sys.modules\n"
        "s.select_platform({'FD_PLATFORM': 'paddly'})\n"
        "import paddle\n"
        "assert paddle.in_dynamic_mode(), 'the caller was left in static-graph mode'\n"
        "print(type(paddle.ones([2]).sum()).__name__)\n"
        + LATER_THREADS_EAGER
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Tensor"


def test_paddle_imported_off_the_main_thread_leaves_later_threads_in_eager_mode() -> None:
    """The core's own import in another thread (a bounded call's) keeps eager mode for the threads after it."""
    code = (
        "import threading, sys\n"
        "from fd_platforms.contract.paddle_import import import_paddle\n"
        "importer = threading.Thread(target=import_paddle)\n"
        "importer.start(); importer.join()\n"
        "import paddle\n" + LATER_THREADS_EAGER
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert done.returncode == 0, done.stderr


# Once the thread that imported paddle has ended (its end closed Paddle's eager-mode context manager, which set
# the process's tracer to None), a thread started later must still be in eager mode: `paddle.empty(..., "uint8")`
# in a plugin's later call failed with "The data type of 'dtype' in empty must be [...] but received uint8".
LATER_THREADS_EAGER = (
    "import threading\n"
    "for thread in threading.enumerate():\n"
    "    if thread.name.startswith('fd-platforms plugin'):\n"
    "        thread.join(30)\n"
    "seen = {}\n"
    "def later():\n"
    "    seen['eager'] = paddle.in_dynamic_mode()\n"
    "    seen['empty'] = paddle.empty([0], dtype='uint8').dtype == paddle.uint8\n"
    "thread = threading.Thread(target=later)\n"
    "thread.start(); thread.join()\n"
    "assert seen == {'eager': True, 'empty': True}, f'a later thread was left in static-graph mode: {seen}'\n"
)


def test_an_import_error_still_reads_as_before(make_plugin) -> None:
    make_plugin("broken", source="raise RuntimeError('vendor SDK too old')\n")
    with pytest.raises(PluginLoadError, match=r"importing '.*' failed: RuntimeError: vendor SDK too old\. Fix: reinstall"):
        select_platform({"FD_PLATFORM": "broken"})


def test_a_hook_error_keeps_its_type_and_message(make_plugin) -> None:
    make_plugin("oserr", source=plugin("oserr", confirm="raise OSError('driver mismatch')"))
    with pytest.raises(PluginError, match="hook confirm_platform raised OSError: driver mismatch"):
        select_platform({"FD_PLATFORM": "oserr"})
    make_plugin("down", source=plugin("down", detect="return Detection(False, 'no device here', 0)"))
    with pytest.raises(PlatformUnavailableError, match="no device here"):
        select_platform({"FD_PLATFORM": "down"})
