"""The core's default hook implementations, registered ``trylast`` beside every platform plugin.

A plugin's own answer wins; these answer where it is silent. The rules live here (through
:mod:`fd_platforms.rules.decision` and the planner), so platforms only supply device facts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..contract.errors import CacheSharingError, DeviceFactsUnavailableError, HostAllocError
from ..contract.hookspecs import hookimpl
from ..contract.types import (
    CacheDecision,
    CacheRoleShape,
    CacheShapeRequest,
    DeviceMemory,
    HostBuffer,
    Plan,
    PlatformLimit,
)
from ..kit.host_memory import allocate_pageable, check_host_nbytes
from ..rules.decision import decide_cache_creation

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..rules.config.settings import CacheConfig
    from ..rules.layout import CacheLayout


@hookimpl(trylast=True)
def confirm_platform() -> None:
    """Nothing to confirm beyond the cheap detection."""


@hookimpl(trylast=True)
def should_create_cache_tensor(
    profile: bool, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str, rule: str
) -> CacheDecision:
    """The one decision rule, in the pinned version."""
    return decide_cache_creation(
        profile=profile,
        num_cpu_blocks=num_cpu_blocks,
        storage_backend=storage_backend,
        splitwise_role=splitwise_role,
        rule=rule,
    )


@hookimpl(trylast=True)
def kv_cache_shapes(request: CacheShapeRequest) -> tuple[CacheRoleShape, ...]:
    """The core's axis order and dtypes."""
    return request.default


@hookimpl(trylast=True)
def host_alloc(nbytes: int, require_pinned: bool) -> HostBuffer:
    """Pageable memory marked ``pinned=False``; an error when the caller demands pinned memory."""
    if require_pinned:
        check_host_nbytes(nbytes)  # a bad size is a ConfigError before anything else
        raise HostAllocError(
            f"pinned host memory of {nbytes} bytes was required, but this platform cannot pin host memory. "
            "Fix: call host_alloc(require_pinned=False) to accept pageable memory, or use a platform that pins"
        )
    return allocate_pageable(nbytes)


@hookimpl(trylast=True)
def device_memory(device_id: int) -> None:
    """No default: memory facts are the platform's to give."""
    raise DeviceFactsUnavailableError(
        f"this platform does not report the memory of device {device_id} (its plugin implements no "
        "device_memory hook). Fix: give the size explicitly (fd-platforms plan --device-memory SIZE), "
        "or add a device_memory hook to the plugin"
    )


@hookimpl(trylast=True)
def declared_limits() -> tuple[PlatformLimit, ...]:
    """No limit unless the platform declares one."""
    return ()


@hookimpl(trylast=True)
def max_num_blocks(
    layout: CacheLayout,
    memory: DeviceMemory,
    cache: CacheConfig,
    limits: tuple[PlatformLimit, ...],
    non_cache_bytes: int | None,
) -> Plan:
    """The planner (imported here: selection never needs its config and TOML machinery)."""
    from ..rules.planner import plan_blocks

    return plan_blocks(layout, memory, cache, non_cache_bytes=non_cache_bytes, limits=limits)


@hookimpl(trylast=True)
def wait_cache_ready(signal_name: str, rank: int, timeout: float | None, creator_pid: int | None) -> float:
    """Attach to the engine's signal and sleep on the rank's slot (see :mod:`fd_platforms.ipc.cache_signal`)."""
    from ..ipc.cache_signal import CacheReadySignal

    with CacheReadySignal.attach(signal_name) as signal:
        return signal.wait(rank, timeout=timeout, creator_pid=creator_pid)


@hookimpl(trylast=True)
def cache_sharing() -> None:
    """Tensors cannot cross processes unless the platform says how."""


@hookimpl(trylast=True)
def export_cache_tensor(name: str, shape: tuple[int, ...], dtype: str, device: str) -> None:
    """No default: sharing is the platform's to provide."""
    raise CacheSharingError(
        f"this platform cannot share KV cache tensor {name} between processes (its plugin implements no "
        "export_cache_tensor hook). Fix: let the worker create its own cache, or add the hooks to the plugin"
    )


@hookimpl(trylast=True)
def open_cache_tensor(name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str) -> None:
    """No default: sharing is the platform's to provide."""
    raise CacheSharingError(
        f"this platform cannot open KV cache tensor {name} exported by another process (its plugin implements "
        "no open_cache_tensor hook). Fix: let the worker create its own cache, or add the hooks to the plugin"
    )


@hookimpl(trylast=True)
def release_device_memory(device: str) -> None:
    """Nothing cached to release unless the platform says so."""
