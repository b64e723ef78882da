"""Calls into the selected platform run in the engine's own thread: Paddle's and the device runtime's
per-thread state (CUDA's current device) is the engine's, and paddle imported by a hook leaves the
engine's signal handlers in place."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from engine_processes import qwen_layout
from fake_paddle import FakeIpc, cuda_paddle, registered, xpu_paddle
from run_helpers import ROOT

from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config.settings import CacheConfig

RECORDER = """
import threading
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity, SharedTensor
from fd_platforms.kit.host_memory import allocate_pageable, system_memory
from fd_platforms.kit.host_sharing import export_host_tensor, open_host_tensor

CALLS = [("import", threading.get_ident())]

def seen(hook):
    CALLS.append((hook, threading.get_ident()))

def closing(shared, hook):
    close = shared._close
    def recorded():
        seen(hook)
        close()
    shared._close = recorded
    return shared

@hookimpl
def platform_identity():
    seen("platform_identity")
    return PlatformIdentity("recorder", "cpu", None)

@hookimpl
def detect_platform():
    seen("detect_platform")
    return Detection(True, "host memory", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def confirm_platform():
    seen("confirm_platform")
    return None

@hookimpl
def device_memory(device_id):
    seen("device_memory")
    return system_memory()

@hookimpl
def declared_limits():
    seen("declared_limits")
    return ()

@hookimpl
def kv_cache_shapes(request):
    seen("kv_cache_shapes")
    return None

@hookimpl
def host_alloc(nbytes, require_pinned):
    seen("host_alloc")
    return allocate_pageable(nbytes)

@hookimpl
def cache_sharing():
    seen("cache_sharing")
    return "memfds, like cpu"

@hookimpl
def export_cache_tensor(name, shape, dtype):
    seen("export_cache_tensor")
    return closing(export_host_tensor(name, shape, dtype), "close exported")

@hookimpl
def open_cache_tensor(name, handle, shape, dtype):
    seen("open_cache_tensor")
    return closing(open_host_tensor(name, handle, shape, dtype), "close opened")

@hookimpl
def release_device_memory(device):
    seen("release_device_memory")
    return None
"""

ENGINE_SEQUENCE = {
    "import",
    "platform_identity",
    "detect_platform",
    "confirm_platform",
    "device_memory",
    "declared_limits",
    "kv_cache_shapes",
    "host_alloc",
    "cache_sharing",
    "export_cache_tensor",
    "open_cache_tensor",
    "close exported",
    "close opened",
    "release_device_memory",
}


def test_every_call_of_an_engines_sequence_runs_on_the_callers_thread(make_plugin) -> None:
    """From the plugin's import to the last close, in an engine thread that is not the main one."""
    # Paddle imported here first, as an engine does in its main thread: imported first in the engine thread,
    # which then ends, it would leave this whole process in static-graph mode (docs/platforms.md)
    pytest.importorskip("paddle")
    make_plugin("recorder", source=RECORDER)
    layout = qwen_layout()
    caller: dict[str, Any] = {}

    def engine() -> None:
        caller["thread"] = threading.get_ident()
        platform = select_platform({"FD_PLATFORM": "recorder"}).platform
        memory = platform.device_memory(0)
        plan = platform.max_num_blocks(layout=layout, cache=CacheConfig(), memory=memory)
        shaped = platform.cache_layout(layout, plan.num_blocks)
        spec = shaped.tensors[0]
        with platform.host_alloc(4096):
            pass
        assert platform.cache_sharing()
        device = platform.identity.device_string(0)
        exported = platform.export_cache_tensor(f"t{os.getpid()}", spec.shape(1), spec.dtype, device)
        opened = platform.open_cache_tensor(exported.name, exported.handle, spec.shape(1), spec.dtype, device)
        opened.close()
        exported.close()
        platform.release_device_memory(device)
        caller["calls"] = list(sys.modules[platform.manager.get_plugin("recorder").__name__].CALLS)

    thread = threading.Thread(target=engine, name="engine")
    thread.start()
    thread.join(120)
    assert "calls" in caller, "the engine sequence did not finish"
    calls = caller["calls"]
    assert {hook for hook, _ in calls} == ENGINE_SEQUENCE, "every step of the sequence was recorded"
    elsewhere = sorted({hook for hook, ident in calls if ident != caller["thread"]})
    assert not elsewhere, f"these plugin calls ran on another thread than the engine's: {elsewhere}"


class PerThreadIpc(FakeIpc):
    """Paddle's device IPC whose current device is per thread, as CUDA's is: a thread starts on device 0."""

    def __init__(self, kind: str) -> None:
        self._local = threading.local()
        super().__init__(kind)
        self.touched: list[int] = []  # every device made current by a switch, in any thread

    @property
    def current(self) -> int:  # type: ignore[override]
        return getattr(self._local, "device", 0)

    @current.setter
    def current(self, device: int) -> None:
        self._local.device = device

    def set_current(self, device: int) -> None:
        self.touched.append(device)
        super().set_current(device)


@pytest.mark.parametrize(("name", "make"), [("cuda", cuda_paddle), ("xpu", xpu_paddle)])
def test_export_and_open_on_the_engines_device_never_touch_device_0(name: str, make) -> None:
    """A rank whose device is 3 exports and opens on device 3 without a switch: no call makes device 0
    current (a CUDA primary context on GPU 0 in every rank is the classic multi-GPU leak)."""
    ipc = PerThreadIpc(name)
    platform = registered(name, make(ipc=ipc))
    device = platform.identity.device_string(3)
    done: dict[str, Any] = {}

    def rank_thread() -> None:
        ipc.current = 3  # the engine selected its rank's device in this thread (paddle.set_device)
        exported = platform.export_cache_tensor("fd_kv.x.t", (8,), "uint8", device)
        opened = platform.open_cache_tensor("fd_kv.x.t", exported.handle, (8,), "uint8", device)
        opened.close()
        exported.close()
        done["current"] = ipc.current

    thread = threading.Thread(target=rank_thread)
    thread.start()
    thread.join(60)
    assert done == {"current": 3}
    assert (ipc.exported_on, ipc.opened_on) == ([3], [3]), "exported and opened on the rank's device"
    assert ipc.touched == [], f"no switch was needed, yet devices {ipc.touched} were made current"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FD_")}
    environ.update(PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=environ, timeout=120
    )


HANDLERS_SURVIVE = """
import os, signal, sys, threading
from fd_platforms.loading.selection import select_platform

def handler(signum, frame):
    print(f"handled {{signal.Signals(signum).name}}", flush=True)

signal.signal(signal.SIGTERM, handler)
signal.signal(signal.SIGINT, handler)
assert "paddle" not in sys.modules

def engine():
    platform = select_platform({{"FD_PLATFORM": {platform!r}}}).platform
    {then}

thread = threading.Thread(target=engine) if {in_thread} else None
if thread: thread.start(); thread.join()
else: engine()
assert "paddle" in sys.modules, "the sequence imported paddle"
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGINT)
print("still running", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "engine-thread"])
@pytest.mark.parametrize(
    ("platform", "then", "plugin"),
    [
        ("cpu", "platform.export_cache_tensor('t', (4,), 'uint8', 'cpu').close()", None),
        ("rawpaddle", "pass", "confirm"),
    ],
    ids=["cpu-export", "hook-imports-paddle"],
)
def test_the_engines_signal_handlers_survive_paddle_imported_by_a_hook(
    make_plugin, platform: str, then: str, plugin: str | None, in_thread: bool
) -> None:
    """Paddle's import installs a C++ SIGTERM handler that ends the process with 'FatalError: Termination
    signal' (exit 143) and the engine's handler never runs; wherever a hook first imports paddle, the
    handlers set before selection still run afterwards."""
    if plugin is not None:
        make_plugin(platform, source=RAW_PADDLE_PLUGIN)  # on sys.path, which the child inherits
    done = run_python(HANDLERS_SURVIVE.format(platform=platform, then=then, in_thread=in_thread))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["handled SIGTERM", "handled SIGINT", "still running"], done.stderr[-2000:]


RAW_PADDLE_PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("rawpaddle", "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "present", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def confirm_platform():
    import paddle  # not the kit's import_paddle: a plugin's own import
    return None
"""
