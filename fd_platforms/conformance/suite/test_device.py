"""Hardware-only: live memory facts, planning on them, and the KV cache on device 0 (where this Paddle
can place tensors on the device: a platform whose device Paddle does not drive skips those, saying why)."""

from __future__ import annotations

import pytest

from ...contract.errors import ConfigError
from ...contract.types import Detection, DeviceMemory
from ...engine.kv_cache import allocate_kv_cache
from ...loading.platform import Platform
from ...rules.config.settings import CacheConfig
from . import hooks, small_layout


@hooks("device_memory")
def test_live_memory_facts(fd_platform: Platform, fd_platform_hardware: Detection) -> None:
    facts = fd_platform.device_memory(0)
    assert isinstance(facts, DeviceMemory) and facts.total_bytes > 0 and facts.source.strip()
    assert facts.free_bytes is None or 0 <= facts.free_bytes <= facts.total_bytes
    assert facts.process_bytes is None or facts.process_bytes >= 0


@hooks("device_memory")
def test_a_device_it_does_not_have_is_a_config_error(fd_platform: Platform, fd_platform_hardware: Detection) -> None:
    with pytest.raises(ConfigError, match="device_id"):
        fd_platform.device_memory(max(fd_platform_hardware.device_count, 1) + 1000)


@hooks("device_memory", "max_num_blocks")
def test_plan_on_live_facts_fits_free_memory(fd_platform: Platform, fd_platform_hardware: Detection) -> None:
    cache = CacheConfig(memory_utilization=0.5)
    facts = fd_platform.device_memory(0)  # given as memory=: on cpu a plan never reads the host's facts by itself
    plan = fd_platform.max_num_blocks(layout=small_layout(cache), cache=cache, memory=facts)
    assert plan.num_blocks * plan.bytes_per_block <= plan.budget_bytes
    if facts.free_bytes is not None:
        assert plan.budget_bytes <= facts.free_bytes


def test_kv_cache_on_device_0_in_layout_order(fd_platform_hardware: Detection, fd_platform_placeable: str) -> None:
    layout = small_layout()
    cache = allocate_kv_cache(layout, 4, fd_platform_placeable)
    try:
        assert cache.names == layout.names() and len(cache.tensors) == len(layout.tensors)
        assert cache.nbytes == 4 * layout.bytes_per_block
        for spec, tensor in zip(layout.tensors, cache.tensors, strict=True):
            assert list(tensor.shape) == list(spec.shape(4))
    finally:
        cache.clear()


@hooks("release_device_memory")
def test_releasing_after_a_freed_cache_says_what_it_called(
    fd_platform: Platform, fd_platform_hardware: Detection, fd_platform_placeable: str
) -> None:
    device = fd_platform_placeable
    cache = allocate_kv_cache(small_layout(), 4, device)
    cache.clear()
    answer = fd_platform.release_device_memory(device)
    assert answer is None or (isinstance(answer, str) and answer.strip()), "text naming the call, or None"
    assert fd_platform.release_device_memory(device) == answer, "a second release is harmless and says the same"
