"""fd-platforms plugin for NVIDIA CUDA GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fd_platforms.plugin import (
    Detection,
    DeviceFacts,
    DeviceMemory,
    HostBuffer,
    PaddlePlatform,
    PinningUnavailable,
    pinned_tensor_buffer,
)

INSTALL_HINT = "pip install paddlepaddle-gpu (Paddle's CUDA build) on a machine with an NVIDIA GPU and driver"
PADDLE_CHECKED = (
    "Paddle 3.3.x (3.3.1 here): its default allocator is not VMM, so both protocols share plain cudaIpc handles "
    "(FLAGS_use_virtual_memory_auto_growth=1, VMM V1, is shared by the fd-platforms protocol only). A Paddle whose "
    "VMM V2 allocator is on by default (develop after Paddle#79605; no release seen) is refused before any export "
    "by both protocols, naming FLAGS_use_vmm_auto_growth_best_fit_allocator_v2: fd-platforms has not seen what "
    "its IPC gives, and FastDeploy's cudaIpcMemHandle record cannot hold it (FastDeploy#8108 pins Paddle for it)"
)


class CudaFacts(DeviceFacts):
    """What Paddle's CUDA build says about NVIDIA GPUs."""

    paddle_calls = (
        "is_compiled_with_cuda",
        "is_compiled_with_rocm",
        "device.cuda.device_count",
        "cuda.mem_get_info",
        "device.cuda.max_memory_allocated",
        "CUDAPinnedPlace",
        "empty",
        "zeros",
        "base.core.eager.Tensor",
        "get_flags",
        "base.core.globals",
        "device.cuda.empty_cache",
    )
    sharing = "CUDA IPC handles through Paddle's DenseTensor._share_cuda and _new_shared_cuda (cudaIpcGetMemHandle)"
    ipc_methods = ("_share_cuda", "_new_shared_cuda")
    current_device_calls = ("base.core.get_cuda_current_device_id", "base.core.set_cuda_current_device_id")
    vmm_flag = "FLAGS_use_virtual_memory_auto_growth"
    allocator_flags = ("FLAGS_use_virtual_memory_auto_growth", "FLAGS_use_vmm_auto_growth_best_fit_allocator_v2")
    empty_cache_call = "device.cuda.empty_cache"
    device_build_calls = (
        "base.core.DenseTensor._share_cuda",
        "base.core.DenseTensor._new_shared_cuda",
        "base.core.get_cuda_current_device_id",
        "base.core.set_cuda_current_device_id",
    )

    @classmethod
    def simulated_paddle(cls, device_type: str, devices: int, total_bytes: int) -> Any:
        return SimpleNamespace(
            is_compiled_with_cuda=lambda: True,
            is_compiled_with_rocm=lambda: False,
            device=SimpleNamespace(
                cuda=SimpleNamespace(device_count=lambda: devices, max_memory_allocated=lambda device=None: 0)
            ),
            cuda=SimpleNamespace(mem_get_info=lambda device=None: (total_bytes, total_bytes)),
        )

    def confirm(self) -> Detection:
        if not self.paddle.is_compiled_with_cuda():
            return Detection(
                False, f"this paddle build has no CUDA (paddle.is_compiled_with_cuda() is False). Fix: {INSTALL_HINT}"
            )
        if self.paddle.is_compiled_with_rocm():
            return Detection(False, f"this paddle build is for ROCm, not CUDA. Fix: {INSTALL_HINT}")
        count = int(self.paddle.device.cuda.device_count())
        if count == 0:
            return Detection(
                False, f"paddle sees no CUDA device. Fix: check the driver (nvidia-smi) and {self.visible_devices_env}"
            )
        return Detection(True, f"paddle sees {count} CUDA devices", count)

    def memory(self, device_id: int) -> DeviceMemory:
        free, total = self.paddle.cuda.mem_get_info(device_id)
        return DeviceMemory(
            total_bytes=int(total),
            free_bytes=int(free),
            process_bytes=int(self.paddle.device.cuda.max_memory_allocated(device_id)),
            source=f"paddle.cuda.mem_get_info({device_id}) and paddle.device.cuda.max_memory_allocated",
        )

    def pin(self, nbytes: int) -> HostBuffer:
        if not self.paddle.is_compiled_with_cuda():
            raise PinningUnavailable("this paddle build has no CUDA")
        return pinned_tensor_buffer(self.paddle, nbytes, "CUDAPinnedPlace", "cuda_pinned")


PLATFORM = PaddlePlatform(
    name="cuda",
    device_type="gpu",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    distributions=("paddlepaddle-gpu",),
    device_glob="/dev/nvidia[0-9]*",
    install_hint=INSTALL_HINT,
    api_versions=">=1.0,<2",
    description="NVIDIA CUDA GPUs",
    facts=CudaFacts,
    paddle_checked=PADDLE_CHECKED,
)
