"""Device facts for Paddle custom devices (Iluvatar, MetaX, ...), written once for all of them.

A custom device is a runtime library Paddle loads from ``CUSTOM_DEVICE_ROOT`` that registers a
device type (``iluvatar_gpu``, ``metax_gpu``). Paddle tells the device count, each device's total
memory (the runtime's device properties) and this process's allocator peak, but not free memory, so the
planner budgets ``total * utilization - this process's peak``. Paddle cannot pin host memory for
custom devices; the vendor runtime can, so pinned memory comes from its host allocator through
``ctypes`` when its library loads (:class:`~fd_platforms.kit.vendor_host.VendorHostRuntime`).
Paddle has no IPC for custom devices either: a cache tensor is shared through the vendor runtime's
own calls (:class:`~fd_platforms.kit.vendor_device.VendorDeviceRuntime`) and wrapped as a Paddle
tensor by :func:`~fd_platforms.kit.foreign_tensor.foreign_tensor`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..contract.errors import CacheSharingError
from ..contract.types import Detection, DeviceMemory, HostBuffer, SharedTensor
from .device_facts import DeviceFacts, byte_shape, device_index, shared_view
from .foreign_tensor import foreign_tensor, load_operator
from .host_memory import PinningUnavailable
from .host_sharing import tensor_bytes
from .vendor_device import handle_bytes, handle_text

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .vendor_device import VendorDeviceRuntime


class CustomDeviceFacts(DeviceFacts):
    """Facts of a Paddle custom device; ``host_runtime`` pins host memory where given."""

    paddle_calls = (
        "device.get_all_custom_device_type",
        "device.device_count",
        "base.core.get_device_properties",
        "device.max_memory_allocated",
        "empty",
        "utils.cpp_extension.load_op_meta_info_and_register_op",
        "_C_ops._run_custom_op",
    )
    no_sharing = "Paddle has no IPC for custom devices, and the platform names no vendor device runtime"

    @classmethod
    def simulated_paddle(cls, device_type: str, devices: int, total_bytes: int) -> Any:
        properties = SimpleNamespace(total_memory=total_bytes)
        return SimpleNamespace(
            device=SimpleNamespace(
                get_all_custom_device_type=lambda: [device_type],
                device_count=lambda kind=None: devices if kind in (None, device_type) else 0,
                max_memory_allocated=lambda place=None: 0,
            ),
            base=SimpleNamespace(core=SimpleNamespace(get_device_properties=lambda kind, index: properties)),
        )

    def confirm(self) -> Detection:
        registered = list(self.paddle.device.get_all_custom_device_type() or [])
        if self.device_type not in registered:
            return Detection(
                False,
                f"paddle registers no {self.device_type!r} device (custom device types: "
                f"{', '.join(registered) or 'none'}): the vendor runtime did not load. Fix: install the "
                f"vendor's paddle plugin, or point CUSTOM_DEVICE_ROOT at the folder holding its library",
            )
        count = int(self.paddle.device.device_count(self.device_type))
        if count == 0:
            return Detection(
                False,
                f"paddle registers {self.device_type!r} but sees no device. "
                f"Fix: check the driver and {self.visible_devices_env}",
            )
        return Detection(True, f"paddle registers {self.device_type!r} with {count} devices", count)

    def memory(self, device_id: int) -> DeviceMemory:
        # Paddle 3.3's public paddle.device.get_device_properties serves only metax_gpu and
        # iluvatar_gpu and raises for every other custom type; the core call it wraps serves all.
        total = int(self.paddle.base.core.get_device_properties(self.device_type, device_id).total_memory)
        place = f"{self.device_type}:{device_id}"
        peak = int(self.paddle.device.max_memory_allocated(place))
        return DeviceMemory(
            total_bytes=total,
            free_bytes=None,
            process_bytes=peak,
            source=f"paddle.base.core.get_device_properties({self.device_type!r}, {device_id}).total_memory "
            "and max_memory_allocated; free memory is unknown on custom devices",
        )

    def pin(self, nbytes: int) -> HostBuffer:
        if self.host_runtime is None:
            raise PinningUnavailable(f"no vendor host allocator is known for {self.device_type!r}")
        return self.host_runtime.allocate(nbytes)

    def export(self, name: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """A zero-filled tensor in the vendor runtime's own allocation, with its IPC handle."""
        runtime = self._runtime(name)
        load_operator(self.paddle)  # compiled, where it must be, before any memory is held
        address, raw = runtime.share(tensor_bytes(shape, dtype), device_index(device), name)
        tensor = self._wrap(runtime, "Free", address, name, shape, dtype, device)
        return shared_view(name, tensor, shape, dtype, handle_text(raw), exported=True)

    def open(self, name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """The tensor another process exported, mapped through the vendor runtime's IPC on ``device``."""
        runtime = self._runtime(name)
        raw = handle_bytes(handle)
        if raw is None:
            raise CacheSharingError(
                f"KV cache tensor {name}'s handle {handle[:60]!r} is not a {self.device_type} IPC handle. "
                "Fix: create and attach on the same platform"
            )
        load_operator(self.paddle)
        address = runtime.open(raw, device_index(device), name)
        tensor = self._wrap(runtime, "IpcCloseMemHandle", address, name, shape, dtype, device)
        return shared_view(name, tensor, shape, dtype, handle, exported=False)

    def _wrap(
        self,
        runtime: VendorDeviceRuntime,
        release: str,
        address: int,
        name: str,
        shape: tuple[int, ...],
        dtype: str,
        device: str,
    ) -> Any:
        """The raw ``uint8`` tensor over ``address``, whose last holder calls the runtime's ``release``
        (``Free`` or ``IpcCloseMemHandle``); called here at once if the tensor cannot be made."""
        try:
            return foreign_tensor(
                self.paddle, address, runtime.release_address(release, name), byte_shape(shape, dtype), "uint8", device
            )
        except BaseException:
            runtime.release(release, address, name)
            raise

    def _runtime(self, name: str) -> VendorDeviceRuntime:
        if self.device_runtime is None:
            raise self._unshareable(name)
        return self.device_runtime
