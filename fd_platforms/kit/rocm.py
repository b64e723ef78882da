"""Device facts for Paddle's ROCm build (Hygon DCUs, AMD GPUs): a ``gpu`` device that is not CUDA.

Paddle's ROCm build (compiled with ``PADDLE_WITH_HIP``) drives its devices as ``gpu:N`` through
the same ``paddle.device.cuda`` calls as the CUDA build: ``is_compiled_with_cuda()`` is true for
both builds and ``is_compiled_with_rocm()`` for this one only (``IsCompiledWithCUDA`` and
``IsCompiledWithROCM`` in Paddle's ``paddle/fluid/pybind/pybind.cc``), so ``is_compiled_with_rocm``
is what tells them apart (FastDeploy asks it before CUDA: ``fastdeploy/platforms/__init__.py:39``).
``CUDAPinnedPlace`` is made by both builds (its constructor refuses only where neither
``PADDLE_WITH_CUDA`` nor ``PADDLE_WITH_HIP`` is set, ``paddle/fluid/pybind/place.cc``), so host
memory is pinned through it. Free device memory is not read: ``paddle.cuda.mem_get_info``
goes through Paddle's CUDA runtime binding, which is not known to serve a HIP build, so the planner
budgets from the total, as on custom devices.

A cache tensor cannot cross processes through Paddle here: ``DenseTensor._share_cuda`` and
``_new_shared_cuda`` are bound only under ``PADDLE_WITH_CUDA`` (``paddle/fluid/pybind/tensor.cc``),
and FastDeploy's cache-manager ops serve CUDA, MACA and XPU alone
(``fastdeploy/cache_manager/ops.py:92-93``: "Prefix cache ops only supported CUDA nor XPU platform").
:attr:`~fd_platforms.kit.device_facts.DeviceFacts.sharing` is None, so a worker the rule sends to
attach is refused when it decides.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..contract.types import Detection, DeviceMemory, HostBuffer
from .device_facts import DeviceFacts, pinned_tensor_buffer
from .host_memory import PinningUnavailable

ROCM_BUILD = "Paddle's ROCm build (pip install paddlepaddle-dcu, on a machine with the DTK/ROCm driver)"


class RocmFacts(DeviceFacts):
    """What Paddle's ROCm build says about its GPUs (Hygon DCUs)."""

    paddle_calls = (
        "is_compiled_with_rocm",
        "device.cuda.device_count",
        "device.cuda.get_device_properties",
        "device.cuda.max_memory_allocated",
        "CUDAPinnedPlace",
        "empty",
        "device.cuda.empty_cache",
    )
    no_sharing = (
        "Paddle's ROCm build has no DenseTensor._share_cuda/_new_shared_cuda (bound only under PADDLE_WITH_CUDA)"
    )
    empty_cache_call = "device.cuda.empty_cache"

    @classmethod
    def simulated_paddle(cls, device_type: str, devices: int, total_bytes: int) -> Any:
        properties = SimpleNamespace(total_memory=total_bytes)
        cuda = SimpleNamespace(
            device_count=lambda: devices,
            max_memory_allocated=lambda device=None: 0,
            get_device_properties=lambda device=None: properties,
        )
        return SimpleNamespace(is_compiled_with_rocm=lambda: True, device=SimpleNamespace(cuda=cuda))

    def confirm(self) -> Detection:
        if not self.paddle.is_compiled_with_rocm():
            return Detection(
                False,
                f"this paddle build is not Paddle's ROCm build (paddle.is_compiled_with_rocm() is False). "
                f"Fix: install {ROCM_BUILD}",
            )
        count = int(self.paddle.device.cuda.device_count())
        if count == 0:
            return Detection(
                False,
                f"paddle's ROCm build sees no device. Fix: check the driver (hy-smi or rocm-smi) and "
                f"{self.visible_devices_env}",
            )
        return Detection(True, f"paddle's ROCm build sees {count} devices", count)

    def memory(self, device_id: int) -> DeviceMemory:
        cuda = self.paddle.device.cuda
        return DeviceMemory(
            total_bytes=int(cuda.get_device_properties(device_id).total_memory),
            free_bytes=None,
            process_bytes=int(cuda.max_memory_allocated(device_id)),
            source=f"paddle.device.cuda.get_device_properties({device_id}).total_memory and max_memory_allocated; "
            "free memory is unknown on Paddle's ROCm build",
        )

    def pin(self, nbytes: int) -> HostBuffer:
        if not self.paddle.is_compiled_with_rocm():
            raise PinningUnavailable("this paddle build is not Paddle's ROCm build")
        return pinned_tensor_buffer(self.paddle, nbytes, "CUDAPinnedPlace", "rocm_pinned")
