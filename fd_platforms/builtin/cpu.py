"""The built-in ``cpu`` reference platform: host memory facts from the OS, Paddle CPU tensors.

It runs everywhere, so every rule of the core can be exercised on any machine. ``host_alloc`` is
the core's default: page-aligned pageable memory marked ``pinned=False``. KV cache tensors cross
processes as memfds (:mod:`fd_platforms.kit.host_sharing`).
"""

from __future__ import annotations

import os

from ..plugin import (
    API_VERSION,
    ConfigError,
    Detection,
    DeviceMemory,
    PlatformIdentity,
    SharedTensor,
    hookimpl,
    system_memory,
)


@hookimpl
def supported_api_versions() -> str:
    """Built into the core, so exactly the core's API."""
    return f"=={API_VERSION}"


@hookimpl
def platform_identity() -> PlatformIdentity:
    return PlatformIdentity(
        name="cpu",
        device_type="cpu",
        visible_devices_env=None,
        description="built-in reference platform: host memory, Paddle CPU tensors",
    )


@hookimpl
def detect_platform() -> Detection:
    return Detection(True, f"built in, always available ({os.cpu_count() or 1} logical CPUs as one device)", 1)


@hookimpl
def device_memory(device_id: int) -> DeviceMemory:
    if device_id != 0:
        raise ConfigError("device_id", device_id, "0 (the cpu platform has one device)", "use device_id=0")
    return system_memory()


@hookimpl
def cache_sharing() -> str:
    return "one memfd per tensor, opened by other processes through /proc/<pid>/fd (fd_platforms.kit.host_sharing)"


@hookimpl
def export_cache_tensor(name: str, shape: tuple[int, ...], dtype: str) -> SharedTensor:
    from ..plugin import export_host_tensor  # not at selection: it needs the layout's dtypes

    return export_host_tensor(name, shape, dtype)


@hookimpl
def open_cache_tensor(name: str, handle: str, shape: tuple[int, ...], dtype: str) -> SharedTensor:
    from ..plugin import open_host_tensor

    return open_host_tensor(name, handle, shape, dtype)
