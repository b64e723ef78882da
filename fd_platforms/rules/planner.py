"""How many KV cache blocks one rank gets: the memory budget, declared platform limits, overrides.

The budget is ``floor(total_bytes * utilization) - non_cache_bytes``, capped by ``free_bytes``
when the platform can tell free memory. Blocks are ``budget // layout.bytes_per_block`` (with MTP
layers of another block ratio, the most blocks whose device tensors fit:
:meth:`CacheLayout.blocks_within() <fd_platforms.rules.layout.CacheLayout.blocks_within>`); a platform's declared limits
(each with its reason) may lower that, and ``num_gpu_blocks_override`` replaces it while still obeying the limits and
the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from ..contract.errors import ConfigError, FdPlatformsError
from ..contract.integers import check_int
from ..contract.types import DTYPE_BYTES, Binding, DeviceMemory, Plan, PlatformLimit
from .config.settings import CacheConfig, check_memory_utilization
from .layout import CacheLayout, check_layout, largest
from .sizes import format_size


class InsufficientMemoryError(FdPlatformsError):
    """The memory budget does not hold a single KV cache block."""

    exit_code = 2

    def __init__(
        self, memory: DeviceMemory, utilization: float, non_cache: int, budget: int, layout: CacheLayout
    ) -> None:
        bytes_per_block = layout.bytes_per_block
        self.budget, self.bytes_per_block = budget, bytes_per_block
        free = "unknown" if memory.free_bytes is None else format_size(memory.free_bytes)
        # Only what shrinks this layout's block: tensor parallelism splits KV heads while a rank holds
        # more than one (a latent MLA/DSA cache is the same on every rank); an 8-bit dtype halves a
        # 2-byte cache (DSA's is uint8 already).
        split = any(role.role == "value" and role.block_shape[0] > 1 for role in layout.roles)
        tp = ", a larger tensor_parallel_size" if split else ""
        fp8 = ", an 8-bit cache_dtype (fp8)" if DTYPE_BYTES[layout.roles[0].dtype] > 1 else ""
        fix = (
            "raise memory_utilization or lower non-cache memory (weights, activations); or shrink the "
            f"block: a smaller block_size{tp}{fp8}"
        )
        if memory.total_bytes < bytes_per_block:  # no device this small: the size given is the likely mistake
            fix = (
                f"the memory itself ({format_size(memory.total_bytes)} from {memory.source}) is less than one block: "
                "give the device's memory per rank with its unit, e.g. 80GiB"
            )
        super().__init__(
            f"KV cache budget {format_size(budget)} ({budget} B) holds no block of {format_size(bytes_per_block)} "
            f"({bytes_per_block} B): total {format_size(memory.total_bytes)} x memory_utilization {utilization} "
            f"- non-cache {format_size(non_cache)}, free {free} (from {memory.source}). Fix: {fix}"
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
    check_memory_utilization(utilization)
    if non_cache_bytes is not None and non_cache_bytes < 0:
        raise ConfigError(
            "non_cache_bytes", non_cache_bytes, "an integer >= 0", "pass the bytes held outside the cache"
        )
    budget = math.floor(memory.total_bytes * Fraction(str(utilization))) - _non_cache(memory, non_cache_bytes)
    return budget if memory.free_bytes is None else min(budget, memory.free_bytes)


def _limit_cap(limit: PlatformLimit, layout: CacheLayout) -> int:
    """Blocks a declared limit allows for this layout (the record admits only these two kinds)."""
    if limit.kind == "max_num_blocks":
        return limit.value
    if layout.mtp_layers and layout.mtp_block_ratio != 1:  # an MTP tensor holds another count of blocks
        return largest(lambda n: layout.largest_tensor_elements(n) <= limit.value, limit.value)
    return limit.value // layout.max_elements_per_block


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


def host_swap_blocks(cache: CacheConfig, bytes_per_block: int) -> int:
    """Host swap blocks per rank: ``num_cpu_blocks``, else the swap space in whole blocks. It needs
    no device facts, so an engine knows it (and the rule's answer) before any rank has planned.

    Swap space smaller than one block is a ConfigError naming the block's size: it would be 0
    blocks, silently, and the rule's ``num_cpu_blocks`` term would flip with it."""
    if cache.num_cpu_blocks or not cache.swap_space_bytes:
        return cache.num_cpu_blocks
    if cache.swap_space_bytes < bytes_per_block:
        raise ConfigError(
            "swap_space",
            format_size(cache.swap_space_bytes),
            f"0 (no host swap space) or at least one block, {format_size(bytes_per_block)} per rank for this layout",
            f"give at least {format_size(bytes_per_block)} of swap space per rank, or none",
        )
    return cache.swap_space_bytes // bytes_per_block


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
    memory_blocks = layout.blocks_within(max(budget, 0))
    if memory_blocks < 1:
        raise InsufficientMemoryError(memory, cache.memory_utilization, non_cache, budget, layout)
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
        if layout.mtp_layers and layout.mtp_block_ratio != 1:
            reason = (
                f"budget {format_size(budget)}: the most blocks whose tensors fit, {layout.mtp_layers} MTP layer(s) "
                f"holding int(num_blocks x {layout.mtp_block_ratio:g}) each"
            )
    layout.check_mtp_blocks(num_blocks)
    num_cpu_blocks = host_swap_blocks(cache, per_block)
    return Plan(
        num_blocks=num_blocks,
        memory_blocks=memory_blocks,
        bytes_per_block=per_block,
        block_size=layout.block_size,
        budget_bytes=budget,
        binding=binding,
        binding_reason=reason,
        num_cpu_blocks=num_cpu_blocks,
        num_draft_blocks=layout.reported_mtp_blocks(num_blocks) or 0,
    )


def check_plan_arguments(layout: object, cache: object, memory: object, non_cache_bytes: object) -> None:
    """The planner's arguments as a caller gave them; a ConfigError naming the first bad one."""
    check_layout(layout)
    if not isinstance(cache, CacheConfig):
        raise ConfigError(
            "cache", cache, "a CacheConfig", "pass the deployment's fd_platforms.rules.config.CacheConfig"
        )
    if memory is not None and not isinstance(memory, DeviceMemory):
        raise ConfigError("memory", memory, "None or a DeviceMemory", "pass platform.device_memory(id) or None")
    if non_cache_bytes is not None:
        check_int(
            "non_cache_bytes",
            non_cache_bytes,
            0,
            what="None or an integer",
            fix="pass the bytes held outside the cache (weights, activation peak), or None",
        )


def plan_violations(
    plan: Plan,
    layout: CacheLayout,
    memory: DeviceMemory,
    cache: CacheConfig,
    limits: Sequence[PlatformLimit],
    non_cache_bytes: int | None,
) -> list[str]:
    """Every invariant of the planner that ``plan`` breaks for these inputs (empty: a sound plan).

    A plan is never bolder than the core's: its bytes per block and block size are the layout's,
    its budget at most the core's, ``memory_blocks`` the floor of its budget over the bytes per
    block, ``num_blocks`` at least 1 and within that floor, the core's budget and every declared
    limit, an override obeyed exactly, and the host swap blocks the config's. Nor is it more
    cautious: a platform gets fewer blocks than memory allows only through a limit it declares
    (``declared_limits``, with its reason, which the plan then shows), so a sound plan's blocks,
    budget and binding constraint are the core planner's own. A cap kept silently in a plugin (the
    block cap FastDeploy's Iluvatar runner kept after GPU dropped it) is drift.
    """
    per_block, budget = layout.bytes_per_block, budget_bytes(memory, cache.memory_utilization, non_cache_bytes)
    broken = []
    if plan.bytes_per_block != per_block:
        broken.append(f"bytes_per_block={plan.bytes_per_block}, but the layout's block takes {per_block} B")
    if plan.block_size != layout.block_size:
        broken.append(f"block_size={plan.block_size}, but the layout's is {layout.block_size}")
    if plan.budget_bytes > budget:
        broken.append(f"budget_bytes={plan.budget_bytes} exceeds the core's budget of {budget} B")
    if plan.bytes_per_block == per_block and plan.memory_blocks != layout.blocks_within(max(plan.budget_bytes, 0)):
        broken.append(
            f"memory_blocks={plan.memory_blocks} is not the most blocks budget_bytes holds "
            f"({layout.blocks_within(max(plan.budget_bytes, 0))})"
        )
    if plan.num_blocks < 1:
        broken.append(f"num_blocks={plan.num_blocks}: a plan holds at least one block")
    if plan.num_blocks > plan.memory_blocks:
        broken.append(f"num_blocks={plan.num_blocks} exceeds its own memory_blocks={plan.memory_blocks}")
    if layout.device_bytes(plan.num_blocks) > budget:
        broken.append(
            f"num_blocks={plan.num_blocks} takes {layout.device_bytes(plan.num_blocks)} B on the device, over the "
            f"core's budget of {budget} B"
        )
    for limit in limits:
        cap = _limit_cap(limit, layout)
        if plan.num_blocks > cap:
            broken.append(
                f"num_blocks={plan.num_blocks} is over the declared {limit.kind}={limit.value} ({cap} blocks)"
            )
    override = cache.num_gpu_blocks_override
    if override is not None and plan.num_blocks != override:
        broken.append(f"num_blocks={plan.num_blocks}, but num_gpu_blocks_override={override}")
    cpu_blocks = host_swap_blocks(cache, per_block)
    if plan.num_cpu_blocks != cpu_blocks:
        broken.append(f"num_cpu_blocks={plan.num_cpu_blocks}, but the cache config gives {cpu_blocks}")
    draft_blocks = layout.reported_mtp_blocks(plan.num_blocks) or 0
    if plan.num_draft_blocks != draft_blocks:
        broken.append(f"num_draft_blocks={plan.num_draft_blocks}, but the layout's draft layers hold {draft_blocks}")
    if broken:
        return broken
    return _undeclared_caution(plan, plan_blocks(layout, memory, cache, non_cache_bytes=non_cache_bytes, limits=limits))


def _undeclared_caution(plan: Plan, core: Plan) -> list[str]:
    """Where a plan that breaks no bound still differs from the core planner's own (``core``): fewer
    blocks, a smaller budget or another binding constraint than the declared limits explain."""
    explained = "declare the limit with its reason in declared_limits"
    broken = []
    if plan.num_blocks != core.num_blocks:
        broken.append(
            f"num_blocks={plan.num_blocks}, but the core plans {core.num_blocks} blocks ({core.binding}: "
            f"{core.binding_reason}); a platform plans fewer blocks only through a declared limit: {explained}"
        )
    if plan.budget_bytes != core.budget_bytes:
        broken.append(f"budget_bytes={plan.budget_bytes}, but the core's budget is {core.budget_bytes} B")
    if plan.binding != core.binding:
        broken.append(f"binding={plan.binding!r}, but the core's plan is bound by {core.binding!r}")
    return broken


def check_host_swap(
    cache: CacheConfig, bytes_per_block: int, host_bytes: int, *, measured: bool, ranks: int = 1
) -> None:
    """Refuse host swap space that ``ranks`` ranks of ``bytes_per_block`` blocks cannot have on a host
    of ``host_bytes`` (``measured``: this host's total memory; else a size the caller gave). It
    needs no plan, so an engine refuses before any process starts."""
    num_cpu_blocks = host_swap_blocks(cache, bytes_per_block)
    wanted = num_cpu_blocks * bytes_per_block * ranks
    if wanted <= host_bytes:
        return
    field = "num_cpu_blocks" if cache.num_cpu_blocks else "swap_space"
    given = cache.num_cpu_blocks if cache.num_cpu_blocks else format_size(cache.swap_space_bytes)
    each = format_size(num_cpu_blocks * bytes_per_block)
    ranks_text = f" for each of {ranks} ranks, {format_size(wanted)} in all," if ranks > 1 else ""
    host = "this host has" if measured else "the host memory given is"
    raise ConfigError(
        field,
        given,
        f"host swap space that fits in host memory: {each} ({num_cpu_blocks} blocks of {bytes_per_block} B)"
        f"{ranks_text} is more than the {format_size(host_bytes)} {host.split(' ', 1)[1]}",
        f"lower {field} (it is per rank) or turn host swap off; to plan for another machine, give its memory "
        "(--host-memory SIZE)",
    )


def shares_one_device(device_type: str) -> bool:
    """Whether every rank of a platform uses its one device (cpu: the host) rather than a device each."""
    return device_type == "cpu"


def memory_per_rank(live: DeviceMemory, device_type: str, ranks: int) -> DeviceMemory:
    """The memory one of ``ranks`` ranks plans on, from its device's live facts: where every rank
    uses the one device, an even share of it (:func:`shared_by`), so ``plan`` and ``run`` agree."""
    return shared_by(live, ranks) if shares_one_device(device_type) else live


def host_memory_not_given(platform: str, host: DeviceMemory, utilization: float, device_id: int | None) -> ConfigError:
    """The error for a plan without ``memory=`` on a platform whose device is the host (cpu): its live
    facts are the whole ``host``'s, and a plan on them would give one rank's cache nearly all of it."""
    available = "unknown" if host.free_bytes is None else format_size(host.free_bytes)
    alone = ""
    if device_id is not None:
        alone = f"; device_id={device_id} alone only picks whose live facts are read, and the one device is the host"
    return ConfigError(
        "memory",
        None,
        f"the memory to plan on, as a DeviceMemory: on platform {platform} the live facts are this host's memory "
        f"({format_size(host.total_bytes)} total, {available} available, from {host.source}), and a plan on them "
        f"gives this one rank's KV cache memory_utilization={utilization:g} of it{alone}",
        "pass memory=DeviceMemory(total_bytes=..., free_bytes=None, process_bytes=None, source=...) sized for the "
        "cache you mean; to plan on the whole host on purpose, pass memory=platform.device_memory(0)",
    )


def shared_by(memory: DeviceMemory, ranks: int) -> DeviceMemory:
    """One device's ``memory`` (on cpu: the host's) as each of ``ranks`` ranks sharing it plans on:
    an even share of total and free memory, so the ranks together stay within the device."""
    check_int("ranks", ranks, 1, None, fix="pass how many ranks share the device")
    if ranks == 1:
        return memory
    return DeviceMemory(
        total_bytes=memory.total_bytes // ranks,
        free_bytes=None if memory.free_bytes is None else memory.free_bytes // ranks,
        process_bytes=memory.process_bytes,
        source=f"{memory.source}, split evenly across {ranks} ranks sharing host memory",
    )


def min_across_ranks(plans: Sequence[Plan]) -> Plan:
    """The plan with the fewest blocks (the first such on ties): every rank must use that number."""
    if not plans:
        raise FdPlatformsError("min_across_ranks needs at least one plan. Fix: plan every rank before combining")
    return min(plans, key=lambda plan: plan.num_blocks)
