"""The block planner: budget, limits with reasons, overrides, host swap blocks, properties."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fd_platforms.contract.errors import ConfigError, FdPlatformsError, RecordError
from fd_platforms.contract.types import DeviceMemory, Plan, PlatformLimit
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import CacheLayout, build_layout
from fd_platforms.rules.planner import (
    InsufficientMemoryError,
    budget_bytes,
    min_across_ranks,
    plan_blocks,
    plan_violations,
)

ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3
QWEN = load_model_config(ROOT / "examples" / "qwen3-30b-a3b")
QWEN_TP4 = build_layout(QWEN, CacheConfig(), ParallelConfig(4, 0))
QWEN_TP4_BYTES = 2 * 2 * 64 * 128 * 1 * 48
# one layer, 8 kv heads: a 2**31-element tensor holds 32767 blocks but 80 GiB hold far more
TINY = build_layout(ModelConfig("tiny", 1, 8, 8, 128), CacheConfig(), ParallelConfig(1, 0))
ELEMENTS_32BIT = PlatformLimit("max_tensor_elements", 2**31 - 1, "32-bit element offsets in attention kernels")


def device(total_gib: float, *, free: int | None = None, process: int | None = None) -> DeviceMemory:
    return DeviceMemory(total_bytes=int(total_gib * GiB), free_bytes=free, process_bytes=process, source="test")


# budget_bytes --------------------------------------------------------------------------------


def test_budget_uses_non_cache_bytes() -> None:
    assert budget_bytes(device(80), 0.9, 20 * GiB) == 80 * GiB * 9 // 10 - 20 * GiB


def test_budget_falls_back_to_process_bytes_then_zero() -> None:
    assert budget_bytes(device(80, process=5 * GiB), 0.9, None) == 80 * GiB * 9 // 10 - 5 * GiB
    assert budget_bytes(device(80, process=5 * GiB), 0.9, 1 * GiB) == 80 * GiB * 9 // 10 - 1 * GiB
    assert budget_bytes(device(80), 0.9, None) == 80 * GiB * 9 // 10


def test_budget_is_capped_by_free_memory() -> None:
    assert budget_bytes(device(80, free=30 * GiB), 0.9, 10 * GiB) == 30 * GiB
    assert budget_bytes(device(80, free=79 * GiB), 0.9, 10 * GiB) == 80 * GiB * 9 // 10 - 10 * GiB


def test_budget_floor_is_exact() -> None:
    assert 100 * 0.29 < 29  # the float product would floor to 28
    assert budget_bytes(DeviceMemory(100, None, None, "t"), 0.29, 0) == 29
    assert budget_bytes(DeviceMemory(10, None, None, "t"), 0.9, 0) == 9
    assert budget_bytes(DeviceMemory(3, None, None, "t"), 0.7, 0) == 2


def test_budget_may_be_negative() -> None:
    assert budget_bytes(device(8), 0.5, 6 * GiB) == -2 * GiB


@pytest.mark.parametrize(
    ("utilization", "non_cache", "field"),
    [(0, 0, "memory_utilization"), (1.5, 0, "memory_utilization"), (0.9, -1, "non_cache_bytes")],
)
def test_budget_rejects(utilization: float, non_cache: int, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        budget_bytes(device(80), utilization, non_cache)
    assert info.value.field == field and "Fix:" in str(info.value)


# plan_blocks ---------------------------------------------------------------------------------


def test_qwen3_tp4_on_80gib() -> None:
    plan = plan_blocks(QWEN_TP4, device(80), CacheConfig(), non_cache_bytes=20 * GiB)
    budget = 80 * GiB * 9 // 10 - 20 * GiB
    assert QWEN_TP4.bytes_per_block == QWEN_TP4_BYTES
    assert plan == Plan(
        num_blocks=budget // QWEN_TP4_BYTES,
        memory_blocks=budget // QWEN_TP4_BYTES,
        bytes_per_block=QWEN_TP4_BYTES,
        block_size=64,
        budget_bytes=budget,
        binding="memory",
        binding_reason=plan.binding_reason,
        num_cpu_blocks=0,
    )
    assert plan.num_blocks == 35498
    assert plan.tokens == 35498 * 64
    assert "budget" in plan.binding_reason


def test_declared_element_limit_binds_with_its_reason() -> None:
    plan = plan_blocks(TINY, device(80), CacheConfig(), limits=[ELEMENTS_32BIT])
    assert TINY.max_elements_per_block == 8 * 64 * 128
    assert plan.num_blocks == (2**31 - 1) // (8 * 64 * 128) == 32767
    assert plan.memory_blocks == 80 * GiB * 9 // 10 // (2 * 2 * 64 * 128 * 8 * 1)
    assert plan.binding == "platform_limit"
    assert "32-bit element offsets" in plan.binding_reason and "max_tensor_elements" in plan.binding_reason


def test_block_count_limit_and_the_lowest_cap_wins() -> None:
    limits = [PlatformLimit("max_num_blocks", 20000, "allocator table size"), ELEMENTS_32BIT]
    plan = plan_blocks(TINY, device(80), CacheConfig(), limits=limits)
    assert (plan.num_blocks, plan.binding) == (20000, "platform_limit")
    assert "allocator table size" in plan.binding_reason


def test_limit_above_memory_does_not_bind() -> None:
    memory_blocks = (80 * GiB * 9 // 10 - 20 * GiB) // QWEN_TP4_BYTES
    for cap in (memory_blocks, memory_blocks + 1):
        plan = plan_blocks(
            QWEN_TP4,
            device(80),
            CacheConfig(),
            non_cache_bytes=20 * GiB,
            limits=[PlatformLimit("max_num_blocks", cap, "r")],
        )
        assert (plan.num_blocks, plan.binding) == (memory_blocks, "memory")


def test_limit_that_allows_no_block() -> None:
    limit = PlatformLimit("max_tensor_elements", 1000, "tiny kernel")
    with pytest.raises(ConfigError) as info:
        plan_blocks(TINY, device(80), CacheConfig(), limits=[limit])
    message = str(info.value)
    assert info.value.field == "block_size" and "tiny kernel" in message and str(8 * 64 * 128) in message
    assert "smaller block_size" in info.value.fix


def test_unknown_limit_kind_is_refused_by_the_record() -> None:
    with pytest.raises(
        RecordError, match=r"PlatformLimit\.kind='max_bytes'.*one of max_tensor_elements, max_num_blocks"
    ):
        PlatformLimit("max_bytes", 1, "r")  # type: ignore[arg-type]


def test_override_binds() -> None:
    plan = plan_blocks(QWEN_TP4, device(80), CacheConfig(num_gpu_blocks_override=1000), non_cache_bytes=20 * GiB)
    assert (plan.num_blocks, plan.binding) == (1000, "override")
    assert plan.memory_blocks == (80 * GiB * 9 // 10 - 20 * GiB) // QWEN_TP4_BYTES
    assert "num_gpu_blocks_override=1000" in plan.binding_reason


def test_override_may_not_exceed_a_declared_limit() -> None:
    with pytest.raises(ConfigError) as info:
        plan_blocks(TINY, device(80), CacheConfig(num_gpu_blocks_override=40000), limits=[ELEMENTS_32BIT])
    message = str(info.value)
    assert info.value.field == "num_gpu_blocks_override" and "num_gpu_blocks_override=40000" in message
    assert "at most 32767 blocks" in message and "32-bit element offsets" in message
    assert "32767" in info.value.fix


def test_override_may_not_exceed_memory() -> None:
    memory_blocks = (80 * GiB * 9 // 10 - 20 * GiB) // QWEN_TP4_BYTES
    with pytest.raises(ConfigError) as info:
        plan_blocks(
            QWEN_TP4, device(80), CacheConfig(num_gpu_blocks_override=memory_blocks + 1), non_cache_bytes=20 * GiB
        )
    message = str(info.value)
    assert f"at most {memory_blocks} blocks" in message and str(QWEN_TP4_BYTES) in message
    assert str(memory_blocks) in info.value.fix
    exact = plan_blocks(
        QWEN_TP4, device(80), CacheConfig(num_gpu_blocks_override=memory_blocks), non_cache_bytes=20 * GiB
    )
    assert exact.num_blocks == memory_blocks


def test_insufficient_memory() -> None:
    with pytest.raises(InsufficientMemoryError) as info:
        plan_blocks(QWEN_TP4, device(16), CacheConfig(), non_cache_bytes=int(14.4 * GiB))
    error = info.value
    message = str(error)
    assert error.exit_code == 2 and isinstance(error, FdPlatformsError)
    assert error.bytes_per_block == QWEN_TP4_BYTES and error.budget == 16 * GiB * 9 // 10 - int(14.4 * GiB)
    for part in (
        "16.00 GiB",
        "memory_utilization 0.9",
        "14.40 GiB",
        str(error.budget),
        str(QWEN_TP4_BYTES),
        "1.50 MiB",
    ):
        assert part in message
    for fix in (
        "raise memory_utilization",
        "lower non-cache memory",
        "fp8",
        "smaller block_size",
    ):
        assert fix in message
    assert "\n" not in message


def test_memory_smaller_than_one_block_is_named_as_the_likely_mistake_not_fixed_by_utilization() -> None:
    """80 bytes of device memory is a size written without its unit, not a budget to tune."""
    with pytest.raises(InsufficientMemoryError) as info:
        plan_blocks(QWEN_TP4, DeviceMemory(80, None, None, "--device-memory"), CacheConfig())
    message = str(info.value)
    assert "Fix: the memory itself (80 B from --device-memory) is less than one block" in message
    assert "e.g. 80GiB" in message and "raise memory_utilization" not in message


@pytest.mark.parametrize(
    ("model", "cache", "suggested", "not_suggested"),
    [
        ("llama-3.1-8b", {}, ("tensor_parallel_size", "8-bit cache_dtype"), ()),  # 2 KV heads per rank at tp 4
        ("llama-3.1-8b", {"cache_dtype": "fp8"}, ("tensor_parallel_size",), ("8-bit cache_dtype",)),
        ("qwen3-30b-a3b", {}, ("8-bit cache_dtype",), ("tensor_parallel_size",)),  # 1 KV head per rank at tp 4
        ("deepseek-v3", {}, ("8-bit cache_dtype",), ("tensor_parallel_size",)),  # MLA: the same on every rank
        ("deepseek-v3.2", {}, (), ("tensor_parallel_size", "8-bit cache_dtype")),  # DSA: uint8 whatever cache_dtype
    ],
)
def test_the_out_of_memory_fix_suggests_only_what_shrinks_this_block(
    model: str, cache: dict[str, str], suggested: tuple[str, ...], not_suggested: tuple[str, ...]
) -> None:
    layout = build_layout(load_model_config(ROOT / "examples" / model), CacheConfig(**cache), ParallelConfig(4, 0))
    with pytest.raises(InsufficientMemoryError) as info:
        plan_blocks(layout, DeviceMemory(layout.bytes_per_block, None, None, "test"), CacheConfig(**cache))
    fix = str(info.value).split("Fix: ", 1)[1]
    assert "smaller block_size" in fix
    assert all(word in fix for word in suggested) and not any(word in fix for word in not_suggested), fix


def test_insufficient_memory_with_negative_budget_and_free_cap() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"budget -2\.00 GiB .* free unknown"):
        plan_blocks(QWEN_TP4, device(8), CacheConfig(memory_utilization=0.5), non_cache_bytes=6 * GiB)
    with pytest.raises(InsufficientMemoryError, match=r"free 1\.00 MiB"):
        plan_blocks(QWEN_TP4, device(80, free=2**20), CacheConfig())


def test_host_swap_blocks_use_the_same_bytes_per_block() -> None:
    swap = plan_blocks(QWEN_TP4, device(80), CacheConfig(swap_space_bytes=16 * GiB))
    assert swap.num_cpu_blocks == 16 * GiB // QWEN_TP4_BYTES == 16 * GiB // (2 * 2 * 64 * 128 * 1 * 48)
    tp1 = build_layout(QWEN, CacheConfig(), ParallelConfig(1, 0))
    assert plan_blocks(tp1, device(80), CacheConfig(swap_space_bytes=16 * GiB)).num_cpu_blocks == 16 * GiB // (
        2 * 2 * 64 * 128 * 4 * 48
    )
    assert plan_blocks(QWEN_TP4, device(80), CacheConfig(num_cpu_blocks=123)).num_cpu_blocks == 123


# min_across_ranks ----------------------------------------------------------------------------


def _plan(blocks: int, reason: str = "memory") -> Plan:
    return Plan(blocks, blocks, 1, 64, blocks, "memory", reason, 0)


def test_min_across_ranks() -> None:
    plans = [_plan(300), _plan(100, "rank1"), _plan(200), _plan(100, "rank3")]
    assert min_across_ranks(plans).binding_reason == "rank1"
    assert min_across_ranks([_plan(7)]) == _plan(7)


def test_min_across_ranks_needs_a_plan() -> None:
    with pytest.raises(FdPlatformsError, match="at least one plan"):
        min_across_ranks([])


# properties ----------------------------------------------------------------------------------

LAYOUTS: list[CacheLayout] = [QWEN_TP4, TINY]
memories = st.integers(min_value=1 * GiB, max_value=192 * GiB)
non_cache = st.integers(min_value=0, max_value=8 * GiB)
utilizations = st.floats(min_value=0.3, max_value=1.0)


@given(st.sampled_from(LAYOUTS), memories, st.integers(min_value=0, max_value=64 * GiB), utilizations, non_cache)
def test_more_memory_never_fewer_blocks(
    layout: CacheLayout, total: int, extra: int, utilization: float, other: int
) -> None:
    cache = CacheConfig(memory_utilization=utilization)
    small = DeviceMemory(total, None, None, "t")
    big = DeviceMemory(total + extra, None, None, "t")
    try:
        fewer = plan_blocks(layout, small, cache, non_cache_bytes=other, limits=[ELEMENTS_32BIT]).num_blocks
    except InsufficientMemoryError:
        fewer = 0
    try:
        more = plan_blocks(layout, big, cache, non_cache_bytes=other, limits=[ELEMENTS_32BIT]).num_blocks
    except InsufficientMemoryError:
        assert fewer == 0
        return
    assert more >= fewer


@given(
    st.sampled_from(LAYOUTS),
    memories,
    st.one_of(st.none(), st.integers(min_value=0, max_value=192 * GiB)),
    utilizations,
    non_cache,
    st.lists(
        st.builds(PlatformLimit, st.just("max_num_blocks"), st.integers(min_value=1, max_value=10**6), st.just("r")),
        max_size=3,
    ),
)
def test_plan_never_exceeds_budget_or_limits(
    layout: CacheLayout, total: int, free: int | None, utilization: float, other: int, limits: list[PlatformLimit]
) -> None:
    memory = DeviceMemory(total, None if free is None else min(free, total), None, "t")
    budget = budget_bytes(memory, utilization, other)
    cache = CacheConfig(memory_utilization=utilization)
    try:
        plan = plan_blocks(layout, memory, cache, non_cache_bytes=other, limits=limits)
    except InsufficientMemoryError:
        assert budget < layout.bytes_per_block
        return
    assert plan.budget_bytes == budget
    assert plan.memory_blocks == budget // layout.bytes_per_block
    assert plan.num_blocks * plan.bytes_per_block <= budget < (plan.memory_blocks + 1) * plan.bytes_per_block
    assert all(plan.num_blocks <= limit.value for limit in limits)
    assert plan.num_blocks == min([plan.memory_blocks, *(limit.value for limit in limits)])
    assert (plan.binding == "platform_limit") == (plan.num_blocks < plan.memory_blocks)
    assert plan.tokens == plan.num_blocks * 64
    assert plan_violations(plan, layout, memory, cache, limits, other) == [], "the planner keeps its own invariants"


# purity --------------------------------------------------------------------------------------


def test_no_paddle_import_and_no_magic_block_cap() -> None:
    code = (
        "import sys; import fd_platforms.rules.sizes, fd_platforms.rules.config, fd_platforms.rules.layout, "
        "fd_platforms.rules.planner; "
        "assert 'paddle' not in sys.modules, 'paddle imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    recorded = ROOT / "fd_platforms" / "fastdeploy" / "releases.py"  # FastDeploy 2.6's own cap, shown, never applied
    for source in (ROOT / "fd_platforms").rglob("*.py"):
        assert source == recorded or "40000" not in source.read_text(), source
        assert source in (recorded, ROOT / "fd_platforms" / "cli" / "rules_command.py") or (
            "block_cap" not in source.read_text()
        ), source
