"""fd-platforms plugin for Intel Gaudi HPUs: device facts only, every rule lives in the core.

SynapseAI's host allocator (``synHostMalloc``, PaddleCustomDevice 77090b64
``backends/intel_hpu/runtime/runtime.cc:631``) takes an acquired device and another argument order
than the kit's ``VendorHostRuntime``, and SynapseAI has no CUDA-shaped IPC: host memory is the core's
pageable fallback, and a worker the rule sends to attach is refused when it decides.
"""

from __future__ import annotations

from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform

PLATFORM = PaddlePlatform(
    name="intel_hpu",
    device_type="intel_hpu",  # PaddleCustomDevice 77090b64 backends/intel_hpu/runtime/runtime.cc:963
    visible_devices_env="HABANA_VISIBLE_MODULES",  # device N is module N (runtime.cc:92, synDeviceAcquireByModuleId)
    distributions=("paddle-intel-hpu",),
    device_glob="/dev/accel/accel_controlD[0-9]*",  # habanalabs' own node; accelN is any accel driver's
    install_hint="pip install paddle-intel-hpu beside paddlepaddle on a machine with Intel Gaudi HPUs and SynapseAI",
    api_versions=">=1.0,<2",
    description="Intel Gaudi HPUs",
    custom_device_library="*intel-hpu*.so",  # libpaddle-intel-hpu.so
    facts=CustomDeviceFacts,
)
