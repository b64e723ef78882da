"""A device platform driven through Paddle: stated facts plus a :class:`~fd_platforms.kit.device_facts.DeviceFacts`
reader.

Plugins build one :class:`PaddlePlatform` record and name it in their entry point. Detection is
cheap (:class:`~fd_platforms.kit.probes.RuntimeFacts`); Paddle is imported only when the platform is
confirmed for selection or asked for device facts (by :meth:`PaddlePlatform.device_facts`, a method:
registering the record, under any pluggy, reads every attribute and must run nothing). Where paddle
cannot be imported the platform is unavailable with its install hint, its host memory is pageable
and every other device fact is a :class:`~fd_platforms.contract.errors.PaddleUnavailableError`. The
host-memory contract and every other rule come from the core, so a plugin holds no logic of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..contract.errors import ConfigError, PaddleUnavailableError
from ..contract.hookspecs import hookimpl
from ..contract.integers import check_int
from ..contract.paddle_import import import_paddle
from ..contract.types import CacheRoleShape, CacheShapeRequest, Detection, DeviceMemory, HostBuffer, SharedTensor
from .allocator_flags import FlagReading
from .device_facts import DeviceFacts
from .host_memory import PinningUnavailable, allocate_host
from .probes import RuntimeFacts
from .vendor_device import VendorDeviceRuntime
from .vendor_host import VendorHostRuntime


@dataclass(frozen=True, kw_only=True)
class PaddlePlatform(RuntimeFacts):
    """Facts of a Paddle-driven device platform.

    ``facts``: the :class:`~fd_platforms.kit.device_facts.DeviceFacts` class that reads this device through Paddle;
    ``host_runtime``: the vendor runtime's pinned host allocator, where Paddle has none;
    ``device_runtime``: the vendor runtime's device memory and IPC, where Paddle has no IPC for the
    device (cache sharing then goes through it);
    ``cache_shapes``: the attention kernels' cache shapes (a function of
    :mod:`fd_platforms.kit.cache_shapes`, or your own; None: the core's);
    ``paddle_checked``: the Paddle releases the platform is checked against, and why (what a newer or older
    one changes), as ``fd-platforms check`` shows it; None where the plugin states none;
    ``load_paddle``: how to get the ``paddle`` module (tests pass a fake).
    """

    facts: type[DeviceFacts]
    host_runtime: VendorHostRuntime | None = None
    device_runtime: VendorDeviceRuntime | None = None
    cache_shapes: Callable[[CacheShapeRequest], tuple[CacheRoleShape, ...] | None] | None = None
    paddle_checked: str | None = None
    load_paddle: Callable[[], Any] = field(default=import_paddle, repr=False, compare=False)

    def device_facts(self) -> DeviceFacts:
        """The device-facts reader, built by the first hook that needs the device: this is where paddle
        is imported. A :class:`~fd_platforms.contract.errors.PaddleUnavailableError` naming the import's failure and the
        install hint where paddle cannot be imported (nothing is kept then: a later call tries again)."""
        reader = self.__dict__.get("_device_facts")
        if reader is None:
            try:
                paddle = self.load_paddle()
            except (ImportError, OSError) as exc:
                raise PaddleUnavailableError(
                    f"platform {self.name} reads its device through Paddle, which cannot be imported here "
                    f"({type(exc).__name__}: {exc}). Fix: {self.install_hint}"
                ) from exc
            reader = self.facts(
                paddle, self.device_type, self.visible_devices_env, self.host_runtime, self.device_runtime
            )
            object.__setattr__(self, "_device_facts", reader)  # a frozen record keeps its reader all the same
        return reader

    def memory_ipc(self) -> FlagReading | None:
        """The Paddle allocator flag in force in this process where the device's sharing goes through Paddle's IPC
        (:meth:`DeviceFacts.memory_ipc() <fd_platforms.kit.device_facts.DeviceFacts.memory_ipc>`), None where none is or
        the sharing is the vendor runtime's."""
        if self.device_runtime is not None:
            return None
        return self.device_facts().memory_ipc()

    @hookimpl
    def confirm_platform(self) -> Detection:
        """Paddle's word on the device: build support and device count; unavailable, with the reason and
        the install hint, where paddle cannot be imported."""
        try:
            return self.device_facts().confirm()
        except PaddleUnavailableError as exc:
            return Detection(False, str(exc))

    @hookimpl
    def device_memory(self, device_id: int) -> DeviceMemory:
        """Memory facts of one local device, from Paddle."""
        check_int(
            "device_id",
            device_id,
            0,
            None,
            what="a local device index",
            fix=f"pass 0 for the first visible {self.name} device",
        )
        count = self.device_facts().confirm().device_count
        if device_id >= count:
            raise ConfigError(
                "device_id",
                device_id,
                f"a local device index below {count} (paddle sees {count} {self.name} device(s))",
                f"pass 0 to {count - 1}, or make more devices visible ({self.visible_devices_env})"
                if count
                else f"run where paddle sees a {self.name} device",
            )
        return self.device_facts().memory(device_id)

    @hookimpl
    def kv_cache_shapes(self, request: CacheShapeRequest) -> tuple[CacheRoleShape, ...] | None:
        """The stated cache shapes, or None for the core's."""
        return None if self.cache_shapes is None else self.cache_shapes(request)

    @hookimpl
    def host_alloc(self, nbytes: int, require_pinned: bool) -> HostBuffer:
        """Pinned host memory where the device can have it, else the core's documented fallback (pageable
        memory, or the error a caller demanding pinned memory gets); without paddle nothing can pin."""

        def pin(size: int) -> HostBuffer:
            try:
                reader = self.device_facts()
            except PaddleUnavailableError as exc:
                raise PinningUnavailable(str(exc)) from None
            return reader.pin(size)

        return allocate_host(nbytes, require_pinned, pin, self.name)

    @hookimpl
    def cache_sharing(self) -> str | None:
        """How a cache tensor moves between processes: through the vendor runtime where one is given and
        loads, else the facts class's statement (neither imports paddle)."""
        if self.device_runtime is not None:
            return self.device_runtime.sharing()
        return self.facts.sharing

    @hookimpl
    def export_cache_tensor(self, name: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """A zero-filled tensor exported through the device's IPC."""
        return self.device_facts().export(name, shape, dtype, device)

    @hookimpl
    def release_device_memory(self, device: str) -> str | None:
        """The device's cached allocator memory returned, through the facts class's call."""
        return self.device_facts().release(device)

    @hookimpl
    def open_cache_tensor(
        self, name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str
    ) -> SharedTensor:
        """A tensor another process exported, opened through the device's IPC."""
        return self.device_facts().open(name, handle, shape, dtype, device)
