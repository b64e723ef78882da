"""fd-platforms plugin for Iluvatar CoreX GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform, PlatformLimit, VendorDeviceRuntime, VendorHostRuntime

PLATFORM = PaddlePlatform(
    name="iluvatar",
    device_type="iluvatar_gpu",
    visible_devices_env="CUDA_VISIBLE_DEVICES",  # CoreX keeps CUDA's variable
    distributions=("paddle-iluvatar-gpu",),
    device_glob="/dev/iluvatar[0-9]*",  # CoreX's driver: one node per GPU, numbered as on the host
    install_hint="pip install paddle-iluvatar-gpu beside paddlepaddle on a machine with Iluvatar GPUs",
    api_versions=">=1.0,<2",
    description="Iluvatar CoreX GPUs",
    custom_device_library="*iluvatar*.so",
    limits=(
        PlatformLimit(
            "max_tensor_elements",
            2**31 - 1,
            "Iluvatar attention kernels address a cache tensor with 32-bit element offsets; past 2**31 "
            "elements they read out of bounds (why FastDeploy's Iluvatar runner kept a 40000-block cap)",
        ),
    ),
    facts=CustomDeviceFacts,
    host_runtime=VendorHostRuntime(library="libcudart.so", alloc="cudaHostAlloc", free="cudaFreeHost"),
    device_runtime=VendorDeviceRuntime(library="libcudart.so", prefix="cuda"),  # cache sharing: cudaIpc*
)
