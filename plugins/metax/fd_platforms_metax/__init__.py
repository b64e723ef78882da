"""fd-platforms plugin for MetaX GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.plugin import (
    CustomDeviceFacts,
    PaddlePlatform,
    VendorDeviceRuntime,
    VendorHostRuntime,
    tokens_before_heads,
)

PLATFORM = PaddlePlatform(
    name="metax",
    device_type="metax_gpu",
    visible_devices_env="MACA_VISIBLE_DEVICES",
    distributions=("paddle-metax-gpu",),
    device_glob=None,  # Paddle's custom-device runtime counts the devices
    install_hint="pip install paddle-metax-gpu beside paddlepaddle on a machine with MetaX GPUs",
    api_versions=">=1.0,<2",
    description="MetaX GPUs",
    custom_device_library="*metax*.so",
    facts=CustomDeviceFacts,
    cache_shapes=tokens_before_heads,  # MetaX's flash backend: [N, block, kv_heads, head_dim]
    host_runtime=VendorHostRuntime(library="libmcruntime.so", alloc="mcMallocHost", free="mcFreeHost"),
    device_runtime=VendorDeviceRuntime(library="libmcruntime.so", prefix="mc"),  # cache sharing: mcIpc*
)
