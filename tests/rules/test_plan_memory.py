"""``Platform.max_num_blocks`` without ``memory=``: refused where the device is the host (cpu), before
any hook, naming the host's memory and the fix; a device platform still plans on its live facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.kit.host_memory import system_memory
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import CacheLayout, build_layout
from fd_platforms.rules.planner import plan_blocks
from fd_platforms.rules.sizes import format_size

QWEN = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b"
FIX = "Fix: pass memory=DeviceMemory(total_bytes=..., free_bytes=None, process_bytes=None, source=...) sized for"
FACTS = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, DeviceMemory, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("facts", "facts_dev", "FACTS_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection(True, "one fake device", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def device_memory(device_id):
    return DeviceMemory(2**34, 2**33, 0, "the fake device's live facts")
"""


def qwen() -> tuple[CacheLayout, CacheConfig]:
    cache = CacheConfig()
    return build_layout(load_model_config(QWEN), cache, ParallelConfig()), cache


def test_on_cpu_a_plan_without_memory_is_a_config_error_naming_the_host_and_the_fix(cpu) -> None:
    layout, cache = qwen()
    with pytest.raises(ConfigError) as info:
        cpu.max_num_blocks(layout=layout, cache=cache)
    error, host = info.value, system_memory()
    message = str(error)
    assert (error.field, error.value, error.exit_code) == ("memory", None, 2)
    assert message.startswith(
        "memory is not given; allowed: the memory to plan on, as a DeviceMemory: on platform "
        f"cpu the live facts are this host's memory ({format_size(host.total_bytes)} total, "
    )
    assert f"available, from {host.source}), and a plan on them gives this one rank's KV cache " in message
    assert "memory_utilization=0.9 of it. " + FIX + " the cache you mean" in message
    assert message.endswith("to plan on the whole host on purpose, pass memory=platform.device_memory(0)")
    assert "device_id" not in message


def test_the_fix_the_error_names_plans_on_the_memory_given(cpu) -> None:
    layout, cache = qwen()
    memory = DeviceMemory(total_bytes=1 << 30, free_bytes=None, process_bytes=None, source="1 GiB for this rank")
    assert cpu.max_num_blocks(layout=layout, cache=cache, memory=memory) == plan_blocks(layout, memory, cache)


def test_it_is_refused_before_any_hook_runs(cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []

    def call(hook: str, expected: type, **kwargs: object) -> object:
        called.append(hook)
        raise AssertionError(f"hook {hook} ran")

    monkeypatch.setattr(cpu, "_call", call)
    layout, cache = qwen()
    with pytest.raises(ConfigError, match=r"^memory is not given"):
        cpu.max_num_blocks(layout=layout, cache=cache, non_cache_bytes=0)
    assert called == []


def test_device_id_alone_is_refused_too_the_one_device_is_the_host(cpu) -> None:
    layout, cache = qwen()
    with pytest.raises(ConfigError) as info:
        cpu.max_num_blocks(layout=layout, cache=cache, device_id=0)
    assert info.value.field == "memory"
    assert "; device_id=0 alone only picks whose live facts are read, and the one device is the host. Fix: " in str(
        info.value
    )


def test_bad_arguments_are_still_named_first(cpu) -> None:
    layout, cache = qwen()
    with pytest.raises(ConfigError, match=r"^host_memory="):
        cpu.max_num_blocks(layout=layout, cache=cache, host_memory="lots")
    with pytest.raises(ConfigError, match=r"^non_cache_bytes="):
        cpu.max_num_blocks(layout=layout, cache=cache, non_cache_bytes=-1)


def test_a_device_platform_still_plans_on_its_live_facts(make_plugin) -> None:
    make_plugin("facts", source=FACTS)
    platform = select_platform({"FD_PLATFORM": "facts"}).platform
    layout, cache = qwen()
    plan = platform.max_num_blocks(layout=layout, cache=cache)
    assert plan == plan_blocks(layout.on_device_type("facts_dev"), platform.device_memory(0), cache)
    assert plan.budget_bytes == 2**33, "capped by the device's free memory, as its live facts say"
