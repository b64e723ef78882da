"""fd-platforms plugin for Nimbus NPUs: the device's facts, stated once; every rule is the core's.

Written only against fd-platforms' public plugin API, ``fd_platforms.plugin`` (``docs/writing-a-plugin.md``):

- detection is cheap: the ``paddle-nimbus-npu`` distribution, or a ``*nimbus*.so`` custom-device
  runtime in ``CUSTOM_DEVICE_ROOT``; paddle is imported only when the platform is selected;
- device memory comes from Paddle's custom-device API (``CustomDeviceFacts``);
- pinned host memory comes from the vendor runtime's allocator, through ctypes;
- the block-table limit is declared with its reason, and the planner applies it.
"""

from __future__ import annotations

from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform, PlatformLimit, VendorHostRuntime

PLATFORM = PaddlePlatform(
    name="nimbus",  # equal to the entry-point name in pyproject.toml
    device_type="nimbus_npu",  # Paddle's custom-device type: tensors live on "nimbus_npu:<id>"
    visible_devices_env="NIMBUS_VISIBLE_DEVICES",
    distributions=("paddle-nimbus-npu",),  # Paddle's Nimbus runtime plugin
    device_glob=None,  # Paddle's custom-device runtime counts the devices
    install_hint="pip install paddle-nimbus-npu beside paddlepaddle on a machine with Nimbus NPUs",
    api_versions=">=1.0,<2",  # written against plugin API 1.0 (fd_platforms.plugin); any later 1.x core accepts it
    description="Nimbus NPUs (example plugin)",
    custom_device_library="*nimbus*.so",
    limits=(
        PlatformLimit(
            "max_num_blocks",
            65536,
            "the Nimbus paged-attention kernel's block table holds 65536 entries per rank",
        ),
    ),
    facts=CustomDeviceFacts,
    host_runtime=VendorHostRuntime(library="libnimbusrt.so", alloc="nimbusHostAlloc", free="nimbusFreeHost"),
)
