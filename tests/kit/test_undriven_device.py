"""A hand-written plugin (a module of ``@hookimpl`` functions, as the plugin guide's section 4 allows) for
a device Paddle does not drive: the kit checks what it can and skips the allocations with the placement
error's reason; ``run`` stops at the allocation with that error, never "plan fewer blocks"."""

from __future__ import annotations

import json

import pytest
from run_helpers import QWEN, console_script, main_in_process

from fd_platforms.conformance import CHECKS

pytestmark = pytest.mark.slow  # a pytest process for the suite; run's worker processes

ZEPHYR = """
from fd_platforms.plugin import ConfigError, Detection, DeviceMemory, PlatformIdentity, hookimpl

@hookimpl
def platform_identity():
    return PlatformIdentity("zephyr", "zephyr_tpu", "ZEPHYR_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection(True, "a Zephyr TPU answers on its vendor runtime", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def device_memory(device_id):
    if device_id != 0:
        raise ConfigError("device_id", device_id, "0, the one Zephyr TPU", "pass 0")
    return DeviceMemory(32 * 2**30, 30 * 2**30, 0, "the Zephyr runtime's memory query")
"""
PLACEMENT = (
    "device 'zephyr_tpu:0': this Paddle cannot place tensors on device type 'zephyr_tpu'; it places them on cpu. "
    "A platform whose device Paddle does not drive cannot hold a KV cache through the engine API. Fix: install the "
    "vendor's Paddle custom-device plugin that registers 'zephyr_tpu'"
)
DEVICE_ALLOCATIONS = 2  # the device column's KV cache on device 0, and the release after it


def test_the_kit_skips_the_device_allocations_with_the_placement_reason(make_plugin) -> None:
    pytest.importorskip("paddle")
    site = make_plugin("zephyr", source=ZEPHYR)
    done = main_in_process("check", "zephyr", "--json", PYTHONPATH=str(site))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)["platforms"][0]
    failed = {name: check["failed"] for name, check in result["checks"].items()}
    assert result["passed"] and failed == dict.fromkeys(CHECKS, 0), failed
    device = result["checks"]["device"]
    assert (device["status"], device["skipped"]) == ("pass", DEVICE_ALLOCATIONS), device
    assert len(device["skip_reasons"]) == 1 and device["skip_reasons"][0].startswith(PLACEMENT), device
    assert "fewer blocks" not in done.stdout


def test_run_stops_at_the_allocation_with_the_placement_error(make_plugin) -> None:
    pytest.importorskip("paddle")
    site = make_plugin("zephyr", source=ZEPHYR)
    run = ("run", "--model", QWEN, "--tp", "1", "--device-memory", "1GiB")
    done = console_script(*run, FD_PLATFORM="zephyr", PYTHONPATH=str(site))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"fd-platforms: error: rank 0: DevicePlacementError: {PLACEMENT}")
    assert "planned 153 blocks" in done.stderr, "selected, detected and planned from its device_memory"
    assert "fewer blocks" not in done.stderr and "Traceback" not in done.stderr
