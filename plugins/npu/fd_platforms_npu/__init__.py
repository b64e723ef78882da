"""fd-platforms plugin for Ascend NPUs: device facts only, every rule lives in the core.

CANN's host allocator ``aclrtMallocHost(void **ptr, size_t size)`` (what Paddle's npu runtime pins with,
PaddleCustomDevice ``backends/npu/runtime/runtime.cc:611``) has no flags argument and returns
ACL error codes (not CUDA's), so the kit's ``VendorHostRuntime`` does not fit it, and CANN's IPC is
not CUDA-shaped: host memory is the core's pageable fallback, and a worker the rule sends to attach
is refused when it decides.
"""

from __future__ import annotations

from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform

PLATFORM = PaddlePlatform(
    name="npu",
    device_type="npu",  # PaddleCustomDevice 77090b64 backends/npu/runtime/runtime.cc:1037
    visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",  # backends/npu/tests/unittests/npu_utils.py:31
    distributions=("paddle-custom-npu",),
    device_glob="/dev/davinci[0-9]*",  # one node per NPU, beside /dev/davinci_manager
    install_hint="pip install paddle-custom-npu beside paddlepaddle on a machine with Ascend NPUs and CANN",
    api_versions=">=1.0,<2",
    description="Ascend NPUs",
    custom_device_library="*custom-npu*.so",  # libpaddle-custom-npu.so
    facts=CustomDeviceFacts,
)
