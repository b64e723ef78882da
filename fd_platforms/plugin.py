"""The plugin API: everything a platform plugin may use, in one module (plugin API 1.0).

A plugin imports from here and nowhere else in ``fd_platforms``::

    from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform, PlatformLimit, hookimpl

``__all__`` is the whole API a plugin may build on: the hook marker and the API version, the
records hooks return, the errors hooks raise, and the kit (``PaddlePlatform`` and the facts it is
built from, host memory, cache sharing, cache shapes, cheap probes). Every other module of the
package is the core's own, and a plugin imports none of them. Removing or changing a name listed
here, or moving this module, raises the API's MAJOR version (the policy is in
:mod:`fd_platforms.contract.api_version`).

Importing this module is cheap and never imports paddle (nor numpy): each name is imported from
the module that defines it on first use (PEP 562), so a plugin that needs records alone, like the
built-in cpu platform, does not load the kit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time each name loads on first use
    from .contract.api_version import API_VERSION
    from .contract.errors import (
        CacheSharingError,
        ConfigError,
        DeviceAllocError,
        DeviceFactsUnavailableError,
        HostAllocError,
        RecordError,
    )
    from .contract.hookspecs import hookimpl
    from .contract.paddle_import import import_paddle
    from .contract.types import (
        CacheDecision,
        CacheRoleShape,
        CacheShapeRequest,
        Detection,
        DeviceMemory,
        HostBuffer,
        Plan,
        PlatformIdentity,
        PlatformLimit,
        SharedTensor,
    )
    from .kit.cache_shapes import eight_bit_as_int8, tokens_before_heads
    from .kit.custom_device import CustomDeviceFacts
    from .kit.device_facts import DeviceFacts, open_ipc_tensor, pinned_tensor_buffer, share_ipc_tensor
    from .kit.host_memory import PinningUnavailable, allocate_host, allocate_pageable, system_memory
    from .kit.host_sharing import export_host_tensor, open_host_tensor
    from .kit.paddle_platform import PaddlePlatform
    from .kit.probes import RuntimeFacts, device_nodes, installed_distribution, visible_count
    from .kit.rocm import RocmFacts
    from .kit.vendor_device import VendorDeviceRuntime
    from .kit.vendor_host import VendorHostRuntime

_SOURCES = {
    ".contract.api_version": "API_VERSION",
    ".contract.errors": "CacheSharingError ConfigError DeviceAllocError DeviceFactsUnavailableError HostAllocError "
    "RecordError",
    ".contract.hookspecs": "hookimpl",
    ".contract.paddle_import": "import_paddle",
    ".contract.types": "CacheDecision CacheRoleShape CacheShapeRequest Detection DeviceMemory HostBuffer Plan "
    "PlatformIdentity PlatformLimit SharedTensor",
    ".kit.cache_shapes": "eight_bit_as_int8 tokens_before_heads",
    ".kit.custom_device": "CustomDeviceFacts",
    ".kit.device_facts": "DeviceFacts open_ipc_tensor pinned_tensor_buffer share_ipc_tensor",
    ".kit.host_memory": "PinningUnavailable allocate_host allocate_pageable system_memory",
    ".kit.host_sharing": "export_host_tensor open_host_tensor",
    ".kit.paddle_platform": "PaddlePlatform",
    ".kit.probes": "RuntimeFacts device_nodes installed_distribution visible_count",
    ".kit.rocm": "RocmFacts",
    ".kit.vendor_device": "VendorDeviceRuntime",
    ".kit.vendor_host": "VendorHostRuntime",
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names.split()}

__all__ = [
    # the hook marker and the version of this API
    "hookimpl",
    "API_VERSION",
    # the records hooks return and receive
    "PlatformIdentity",
    "Detection",
    "DeviceMemory",
    "PlatformLimit",
    "HostBuffer",
    "SharedTensor",
    "CacheShapeRequest",
    "CacheRoleShape",
    "CacheDecision",
    "Plan",
    # the errors hooks raise (the core raises the others about a plugin)
    "ConfigError",
    "RecordError",
    "DeviceFactsUnavailableError",
    "HostAllocError",
    "DeviceAllocError",
    "CacheSharingError",
    # a platform Paddle drives, from its facts
    "PaddlePlatform",
    "DeviceFacts",
    "CustomDeviceFacts",
    "RocmFacts",
    "VendorHostRuntime",
    "VendorDeviceRuntime",
    "import_paddle",
    # cheap detection from stated facts
    "RuntimeFacts",
    "installed_distribution",
    "device_nodes",
    "visible_count",
    # host memory: pinned where a platform can pin, else pageable
    "PinningUnavailable",
    "pinned_tensor_buffer",
    "allocate_host",
    "allocate_pageable",
    "system_memory",
    # cache tensors other processes open: Paddle's IPC, or memfds for memory that is the host's
    "share_ipc_tensor",
    "open_ipc_tensor",
    "export_host_tensor",
    "open_host_tensor",
    # ready answers for kv_cache_shapes
    "tokens_before_heads",
    "eight_bit_as_int8",
]


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name], __package__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fd_platforms.plugin' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
