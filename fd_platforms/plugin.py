"""The plugin API: everything a platform plugin may use, in one module (plugin API 1.5).

A plugin imports from here and nowhere else in ``fd_platforms``::

    from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform, PlatformLimit, hookimpl

:data:`__all__` is the whole API a plugin may build on: the hook marker and the API version, the
records hooks return, the errors hooks raise, and the kit (``PaddlePlatform`` and the facts it is
built from, host memory, cache sharing, cache shapes, cheap probes). Every other module of the
package is the core's own, and a plugin written for API 1.5 or later imports none of them. Removing
or changing a name listed here, or moving this module, raises the API's MAJOR version (the policy
is in :mod:`fd_platforms.contract.api_version`). The module paths plugins imported before 1.5 keep
working until API 2.0 (:data:`~fd_platforms.contract.api_version.DEPRECATED_PLUGIN_MODULES`).

Importing this module never imports paddle (nor numpy). It imports the contract and the kit
eagerly, on purpose: the core imports the plugin API modules
(:data:`~fd_platforms.contract.api_version.PLUGIN_API_MODULES`) once before it loads several plugins
in threads at once, so that those threads only find the modules they share. That costs about what
importing one bundled plugin costs anyway (PaddlePlatform builds on most of the kit).
"""

from __future__ import annotations

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
from .kit.vendor_device import VendorDeviceRuntime
from .kit.vendor_host import VendorHostRuntime

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
