"""fd-platforms plugin for Kunlun XPUs: device facts only, every rule lives in the core."""

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
    eight_bit_as_int8,
    pinned_tensor_buffer,
)

INSTALL_HINT = "pip install paddlepaddle-xpu (Paddle's Kunlun build) on a machine with Kunlun XPUs"


class XpuFacts(DeviceFacts):
    """What Paddle's XPU build says about Kunlun XPUs."""

    paddle_calls = (
        "is_compiled_with_xpu",
        "device.xpu.device_count",
        "device.xpu.memory_total",
        "device.xpu.memory_used",
        "device.xpu.max_memory_allocated",
        "XPUPinnedPlace",
        "empty",
        "zeros",
        "base.core.eager.Tensor",
        "device.xpu.empty_cache",
    )
    sharing = "XPU IPC handles through Paddle's DenseTensor._share_xpu and _new_shared_xpu"
    device_build_calls = (
        "base.core.DenseTensor._share_xpu",
        "base.core.DenseTensor._new_shared_xpu",
        "base.core.get_xpu_current_device_id",
    )
    ipc_methods = ("_share_xpu", "_new_shared_xpu")
    current_device_calls = ("base.core.get_xpu_current_device_id", "base.core.set_xpu_current_device_id")
    optional_build_calls = ("base.core.set_xpu_current_device_id",)  # Paddle 3.3.2 and newer (PR 77568)
    empty_cache_call = "device.xpu.empty_cache"

    @classmethod
    def simulated_paddle(cls, device_type: str, devices: int, total_bytes: int) -> Any:
        xpu = SimpleNamespace(
            device_count=lambda: devices,
            memory_total=lambda device=None: total_bytes,
            memory_used=lambda device=None: 0,
            max_memory_allocated=lambda device=None: 0,
        )
        return SimpleNamespace(is_compiled_with_xpu=lambda: True, device=SimpleNamespace(xpu=xpu))

    def confirm(self) -> Detection:
        if not self.paddle.is_compiled_with_xpu():
            return Detection(
                False,
                f"this paddle build has no XPU support (paddle.is_compiled_with_xpu() is False). Fix: {INSTALL_HINT}",
            )
        count = int(self.paddle.device.xpu.device_count())
        if count == 0:
            return Detection(
                False, f"paddle sees no Kunlun XPU. Fix: check the driver (xpu-smi) and {self.visible_devices_env}"
            )
        return Detection(True, f"paddle sees {count} Kunlun XPUs", count)

    def memory(self, device_id: int) -> DeviceMemory:
        xpu = self.paddle.device.xpu
        total, used = int(xpu.memory_total(device_id)), int(xpu.memory_used(device_id))
        return DeviceMemory(
            total_bytes=total,
            free_bytes=max(total - used, 0),
            process_bytes=int(xpu.max_memory_allocated(device_id)),
            source=f"paddle.device.xpu.memory_total/memory_used({device_id}) and max_memory_allocated",
        )

    def pin(self, nbytes: int) -> HostBuffer:
        if not self.paddle.is_compiled_with_xpu():
            raise PinningUnavailable("this paddle build has no XPU support")
        return pinned_tensor_buffer(self.paddle, nbytes, "XPUPinnedPlace", "xpu_pinned")


PLATFORM = PaddlePlatform(
    name="xpu",
    device_type="xpu",
    visible_devices_env="XPU_VISIBLE_DEVICES",
    distributions=("paddlepaddle-xpu",),
    device_glob="/dev/xpu[0-9]*",
    install_hint=INSTALL_HINT,
    api_versions=">=1.0,<2",
    description="Kunlun XPUs",
    facts=XpuFacts,
    cache_shapes=eight_bit_as_int8,  # XPU kernels take an 8-bit cache as int8 (GPU's is uint8)
)
