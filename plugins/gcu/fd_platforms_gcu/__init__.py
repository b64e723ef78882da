"""fd-platforms plugin for Enflame GCUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform, VendorHostRuntime

PLATFORM = PaddlePlatform(
    name="gcu",
    device_type="gcu",  # PaddleCustomDevice 77090b64 backends/gcu/runtime/runtime.cc:35 kDeviceType
    visible_devices_env="TOPS_VISIBLE_DEVICES",
    distributions=("paddle-custom-gcu",),
    device_glob=None,  # cards are /dev/gcuN, but /dev/gcu[0-9]* also finds the codec nodes /dev/gcuNvidM
    install_hint="pip install paddle-custom-gcu beside paddlepaddle on a machine with Enflame GCUs",
    api_versions=">=1.0,<2",
    description="Enflame GCUs",
    custom_device_library="*custom-gcu*.so",  # libpaddle-custom-gcu.so
    facts=CustomDeviceFacts,
    # Paddle's gcu runtime pins with topsHostMalloc(&ptr, size, topsHostMallocDefault) and frees with
    # topsHostFree (backends/gcu/runtime/runtime.cc:263, 288); libtopsrt: backends/gcu/cmake/external/gcu.cmake:30
    host_runtime=VendorHostRuntime(library="libtopsrt.so", alloc="topsHostMalloc", free="topsHostFree"),
)
