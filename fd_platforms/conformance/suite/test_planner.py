"""The planner on the platform's facts: never over budget, floors, limits with reasons, too little memory."""

from __future__ import annotations

import pytest

from ...contract.types import DeviceMemory, PlatformLimit
from ...loading.platform import Platform
from ...rules.config.settings import CacheConfig
from ...rules.planner import InsufficientMemoryError, budget_bytes
from . import hooks, small_layout

GiB = 1 << 30
LIMIT_KINDS = ("max_num_blocks", "max_tensor_elements")


def memory(total: int, free: int | None = None) -> DeviceMemory:
    return DeviceMemory(total_bytes=total, free_bytes=free, process_bytes=None, source="conformance")


@hooks("declared_limits")
def test_declared_limits_are_explained(fd_platform: Platform) -> None:
    for limit in fd_platform.declared_limits():
        assert isinstance(limit, PlatformLimit)
        assert limit.kind in LIMIT_KINDS, f"limit kind {limit.kind!r}: one of {LIMIT_KINDS}"
        assert isinstance(limit.value, int) and limit.value > 0
        assert len(limit.reason.split()) >= 3, f"limit {limit.kind} needs a reason in words, got {limit.reason!r}"


@hooks("max_num_blocks", "declared_limits")
@pytest.mark.parametrize(
    ("total", "free", "utilization", "non_cache"),
    [
        (80 * GiB, None, 0.9, 20 * GiB),
        (80 * GiB, 30 * GiB, 0.9, 20 * GiB),
        (24 * GiB + 12345, None, 0.75, 3 * GiB + 7),
        (64 * GiB, None, 1.0, 0),
        (3 * GiB, 3 * GiB, 0.5, 1 * GiB),
    ],
)
def test_never_over_budget_and_floored(
    fd_platform: Platform, total: int, free: int | None, utilization: float, non_cache: int
) -> None:
    cache = CacheConfig(memory_utilization=utilization)
    layout = small_layout(cache)
    facts = memory(total, free)
    plan = fd_platform.max_num_blocks(layout=layout, cache=cache, memory=facts, non_cache_bytes=non_cache)
    budget = budget_bytes(facts, utilization, non_cache)
    assert plan.budget_bytes == budget
    assert plan.bytes_per_block == layout.bytes_per_block
    assert plan.memory_blocks == budget // layout.bytes_per_block, "memory blocks are the budget floored"
    assert plan.num_blocks * plan.bytes_per_block <= budget, "the plan exceeds its budget"
    if plan.binding == "memory":
        assert plan.num_blocks == plan.memory_blocks
    else:
        assert plan.binding == "platform_limit" and plan.num_blocks < plan.memory_blocks
        reasons = [limit.reason for limit in fd_platform.declared_limits()]
        assert any(reason in plan.binding_reason for reason in reasons), "a binding limit is explained by its reason"


@hooks("max_num_blocks", "declared_limits")
def test_no_cap_but_the_declared_limits(fd_platform: Platform) -> None:
    """Memory for a million blocks: only a declared limit may stop the plan short (no fixed cap)."""
    cache = CacheConfig(memory_utilization=1.0)
    layout = small_layout(cache)
    blocks = 1_000_000
    plan = fd_platform.max_num_blocks(
        layout=layout, cache=cache, memory=memory(blocks * layout.bytes_per_block), non_cache_bytes=0
    )
    caps = [_cap(limit, layout.max_elements_per_block) for limit in fd_platform.declared_limits()]
    assert plan.num_blocks == min([blocks, *caps])
    if plan.num_blocks < blocks:
        assert plan.binding == "platform_limit"


@hooks("max_num_blocks", "declared_limits")
def test_each_declared_limit_binds_with_its_reason(fd_platform: Platform) -> None:
    limits = fd_platform.declared_limits()
    if not limits:
        pytest.skip(f"{fd_platform.name} declares no limits")
    cache = CacheConfig(memory_utilization=1.0)
    layout = small_layout(cache)
    for limit in limits:
        cap = _cap(limit, layout.max_elements_per_block)
        tightest = min(_cap(other, layout.max_elements_per_block) for other in limits)
        if cap != tightest:
            continue  # a looser limit cannot bind while a tighter one is declared
        plan = fd_platform.max_num_blocks(
            layout=layout, cache=cache, memory=memory((cap + 10) * layout.bytes_per_block), non_cache_bytes=0
        )
        assert (plan.num_blocks, plan.binding) == (cap, "platform_limit")
        assert limit.reason in plan.binding_reason


@hooks("max_num_blocks")
def test_too_little_memory_is_the_planners_error(fd_platform: Platform) -> None:
    cache = CacheConfig()
    layout = small_layout(cache)
    with pytest.raises(InsufficientMemoryError) as info:
        fd_platform.max_num_blocks(
            layout=layout, cache=cache, memory=memory(layout.bytes_per_block // 2), non_cache_bytes=0
        )
    assert info.value.exit_code == 2 and "Fix:" in str(info.value)


def _cap(limit: PlatformLimit, max_elements_per_block: int) -> int:
    if limit.kind == "max_num_blocks":
        return limit.value
    return limit.value // max_elements_per_block  # the same arithmetic, written independently
