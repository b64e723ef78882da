"""How many KV cache blocks one rank gets: the memory budget, declared platform limits, overrides.

The budget is ``floor(total_bytes * utilization) - non_cache_bytes``, capped by ``free_bytes``
when the platform can tell free memory. Blocks are ``budget // layout.bytes_per_block``; a
platform's declared limits (each with its reason) may lower that, and
``num_gpu_blocks_override`` replaces it while still obeying the limits and the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from .config import CacheConfig
from .errors import ConfigError, FdPlatformsError
from .layout import CacheLayout
from .sizes import format_size
from .types import Binding, DeviceMemory, Plan, PlatformLimit


class InsufficientMemoryError(FdPlatformsError):
    """The memory budget does not hold a single KV cache block."""

    exit_code = 2

    def __init__(
        self, memory: DeviceMemory, utilization: float, non_cache: int, budget: int, bytes_per_block: int
    ) -> None:
        self.budget, self.bytes_per_block = budget, bytes_per_block
        free = "unknown" if memory.free_bytes is None else format_size(memory.free_bytes)
        super().__init__(
            f"KV cache budget {format_size(budget)} ({budget} B) holds no block of {format_size(bytes_per_block)} "
            f"({bytes_per_block} B): total {format_size(memory.total_bytes)} x memory_utilization {utilization} "
            f"- non-cache {format_size(non_cache)}, free {free} (from {memory.source}). "
            "Fix: raise memory_utilization, lower non-cache memory (weights, activations), use a larger "
            "tensor_parallel_size, an fp8 cache_dtype, or a smaller block_size"
        )


def _non_cache(memory: DeviceMemory, non_cache_bytes: int | None) -> int:
    if non_cache_bytes is not None:
        return non_cache_bytes
    return memory.process_bytes or 0


def budget_bytes(memory: DeviceMemory, utilization: float, non_cache_bytes: int | None) -> int:
    """Bytes the KV cache may take: ``floor(total * utilization) - non_cache``, at most ``free_bytes``.

    ``non_cache`` is ``non_cache_bytes`` when given, else ``memory.process_bytes``, else 0. When
    the platform knows free memory the budget never exceeds it. May be negative.
    """
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ConfigError("memory_utilization", utilization, "a number greater than 0 and at most 1", "use e.g. 0.9")
    if non_cache_bytes is not None and non_cache_bytes < 0:
        raise ConfigError(
            "non_cache_bytes", non_cache_bytes, "an integer >= 0", "pass the bytes held outside the cache"
        )
    budget = math.floor(memory.total_bytes * Fraction(str(utilization))) - _non_cache(memory, non_cache_bytes)
    return budget if memory.free_bytes is None else min(budget, memory.free_bytes)


def _limit_cap(limit: PlatformLimit, layout: CacheLayout) -> int:
    """Blocks a declared limit allows for this layout."""
    if limit.kind == "max_num_blocks":
        return limit.value
    if limit.kind == "max_tensor_elements":
        return limit.value // layout.max_elements_per_block
    raise FdPlatformsError(
        f"PlatformLimit kind {limit.kind!r} is unknown; allowed: max_num_blocks, max_tensor_elements. "
        "Fix: declare the limit with one of those kinds"
    )


def _tightest(layout: CacheLayout, limits: Sequence[PlatformLimit]) -> tuple[int, PlatformLimit] | None:
    """The lowest block cap among ``limits`` and the limit giving it; ConfigError if it allows no block."""
    caps = [(_limit_cap(limit, layout), limit) for limit in limits]
    if not caps:
        return None
    cap, limit = min(caps, key=lambda pair: pair[0])
    if cap < 1:
        raise ConfigError(
            "block_size",
            layout.block_size,
            f"a block within {limit.kind}={limit.value} ({limit.reason}); "
            f"the largest cache tensor needs {layout.max_elements_per_block} elements per block",
            "use a smaller block_size or a larger tensor_parallel_size",
        )
    return cap, limit


def _check_override(
    override: int, tightest: tuple[int, PlatformLimit] | None, memory_blocks: int, budget: int, per_block: int
) -> None:
    """num_gpu_blocks_override must obey the tightest declared limit and the memory budget."""
    if tightest is not None and override > tightest[0]:
        cap, limit = tightest
        raise ConfigError(
            "num_gpu_blocks_override",
            override,
            f"at most {cap} blocks under {limit.kind}={limit.value} ({limit.reason})",
            f"lower num_gpu_blocks_override to {cap} or less, or remove it",
        )
    if override > memory_blocks:
        raise ConfigError(
            "num_gpu_blocks_override",
            override,
            f"at most {memory_blocks} blocks (budget {budget} B // {per_block} B per block)",
            f"lower num_gpu_blocks_override to {memory_blocks} or less, or raise memory_utilization",
        )


def plan_blocks(
    layout: CacheLayout,
    memory: DeviceMemory,
    cache: CacheConfig,
    *,
    non_cache_bytes: int | None = None,
    limits: Sequence[PlatformLimit] = (),
) -> Plan:
    """Blocks for one rank, with what bound the number (memory, a platform limit, or the override)."""
    per_block = layout.bytes_per_block
    non_cache = _non_cache(memory, non_cache_bytes)
    budget = budget_bytes(memory, cache.memory_utilization, non_cache_bytes)
    memory_blocks = max(budget, 0) // per_block
    if memory_blocks < 1:
        raise InsufficientMemoryError(memory, cache.memory_utilization, non_cache, budget, per_block)
    tightest = _tightest(layout, limits)
    override = cache.num_gpu_blocks_override
    binding: Binding
    if override is not None:
        _check_override(override, tightest, memory_blocks, budget, per_block)
        num_blocks, binding, reason = override, "override", f"num_gpu_blocks_override={override}"
    elif tightest is not None and tightest[0] < memory_blocks:
        (num_blocks, limit), binding = tightest, "platform_limit"
        reason = f"{limit.kind}={limit.value}: {limit.reason}"
    else:
        num_blocks, binding = memory_blocks, "memory"
        reason = f"budget {format_size(budget)} // {format_size(per_block)} per block"
    num_cpu_blocks = cache.num_cpu_blocks or cache.swap_space_bytes // per_block
    return Plan(
        num_blocks=num_blocks,
        memory_blocks=memory_blocks,
        bytes_per_block=per_block,
        block_size=layout.block_size,
        budget_bytes=budget,
        binding=binding,
        binding_reason=reason,
        num_cpu_blocks=num_cpu_blocks,
    )


def min_across_ranks(plans: Sequence[Plan]) -> Plan:
    """The plan with the fewest blocks (the first such on ties): every rank must use that number."""
    if not plans:
        raise FdPlatformsError("min_across_ranks needs at least one plan. Fix: plan every rank before combining")
    return min(plans, key=lambda plan: plan.num_blocks)
