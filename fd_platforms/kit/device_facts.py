"""The seam between the core and Paddle: what a device platform learns from Paddle, nothing else.

A :class:`DeviceFacts` subclass answers these questions for one kind of device — is the Paddle
build able to drive it (and how many devices does it see), how much memory does a device have,
can host memory be pinned for it, and, where it can, how a KV cache tensor crosses processes —
using only the Paddle calls it lists in ``paddle_calls`` (and ``device_build_calls``, the ones only
the device's own Paddle build has). Tests hand it a fake ``paddle`` holding exactly those names;
a test against the installed Paddle checks that each name exists there, so a renamed API is
caught without hardware. Every rule (the decision, the planner, the host-memory contract) stays
in the core and is never written in a subclass.
"""

from __future__ import annotations

import base64
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..contract.errors import CacheSharingError, ConfigError, HostAllocError
from ..contract.paddle_import import import_paddle
from ..contract.types import DTYPE_BYTES, Detection, DeviceMemory, HostBuffer, SharedTensor
from .allocator_flags import PADDLE_ALLOCATOR_FLAGS, AllocatorFlag, FlagReading, read_flag
from .host_memory import PinningUnavailable
from .host_sharing import tensor_bytes
from .vendor_device import HANDLE_BYTES, handle_bytes

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .vendor_device import VendorDeviceRuntime
    from .vendor_host import VendorHostRuntime


@dataclass(eq=False, repr=False)  # the __init__ alone: equal only to itself, as before
class DeviceFacts(ABC):
    """Device facts of one platform, read through ``paddle`` (the real module, or a test's fake).

    ``device_type`` is Paddle's device type (``gpu``, ``xpu``, ``iluvatar_gpu``, ...),
    ``visible_devices_env`` the variable that limits visible devices, ``host_runtime`` the vendor
    runtime's pinned host allocator where Paddle has none for the device, ``device_runtime`` its
    device memory and IPC where Paddle has no IPC for the device.
    """

    #: Dotted names under ``paddle`` this class calls (``"device.cuda.device_count"``).
    paddle_calls: ClassVar[tuple[str, ...]]
    #: How a KV cache tensor crosses processes on this device, in one sentence; None where it cannot.
    sharing: ClassVar[str | None] = None
    #: What is missing where a tensor cannot cross processes, named in the error an export or open raises.
    no_sharing: ClassVar[str] = "this device's facts state no way to share them"
    #: Paddle calls the sharing makes that only the device's own Paddle build has (the CPU wheel lacks them).
    device_build_calls: ClassVar[tuple[str, ...]] = ()
    #: Paddle's ``DenseTensor`` methods that export and open a tensor's IPC handle on this device
    #: (``("_share_cuda", "_new_shared_cuda")``); with them :meth:`export` and :meth:`open` share through
    #: Paddle's own IPC. None: the device's tensors cannot be shared this way.
    ipc_methods: ClassVar[tuple[str, str] | None] = None
    #: Paddle's get and set of the device's *current* id, dotted under ``paddle``, where its IPC works on
    #: the current device (CUDA's and XPU's export label the handle with it; CUDA's open maps onto it):
    #: export and open then run with the tensor's device current, and restore the previous one.
    current_device_calls: ClassVar[tuple[str, str] | None] = None
    #: Calls of the device's build used where they exist (a setter newer than some builds).
    optional_build_calls: ClassVar[tuple[str, ...]] = ()
    #: The flag that turns on Paddle's virtual-memory (VMM) allocator, whose IPC handles are another
    #: kind (5 fields, not 7): an export is refused where the build's handle does not cover VMM memory,
    #: an open where this process cannot open the exporter's kind.
    vmm_flag: ClassVar[str | None] = None
    #: The names of Paddle's allocator flags that change what the device's IPC handles cover, oldest first, each
    #: one the kit knows (:data:`~.allocator_flags.PADDLE_ALLOCATOR_FLAGS`: what its memory's IPC is, and whether a
    #: protocol carries it); :meth:`memory_ipc` reads them, and :attr:`vmm_flag`.
    allocator_flags: ClassVar[tuple[str, ...]] = ()
    #: The call that returns the allocator's cached memory to the device, dotted under ``paddle``
    #: (``"device.cuda.empty_cache"``); None where there is none to call.
    empty_cache_call: ClassVar[str | None] = None

    paddle: Any
    device_type: str
    visible_devices_env: str
    host_runtime: VendorHostRuntime | None = None
    device_runtime: VendorDeviceRuntime | None = None

    @classmethod
    def simulated_paddle(cls, device_type: str, devices: int, total_bytes: int) -> Any:
        """A ``paddle`` stand-in answering this class's device and memory calls for ``devices``
        devices of ``total_bytes`` each, or None where the class has none. The conformance kit
        runs a platform's device hooks on it, so a wrong answer is found without the hardware."""
        return None

    @abstractmethod
    def confirm(self) -> Detection:
        """Whether this Paddle build drives the device, with the number of devices it sees."""

    @abstractmethod
    def memory(self, device_id: int) -> DeviceMemory:
        """Total, free (``None`` where unknown) and this process's peak bytes of one device."""

    @abstractmethod
    def pin(self, nbytes: int) -> HostBuffer:
        """``nbytes`` of pinned host memory; :class:`~fd_platforms.kit.host_memory.PinningUnavailable` where that cannot
        be had.

        Any other failure (the allocation itself) is raised as
        :class:`~fd_platforms.contract.errors.HostAllocError` naming the size.
        """

    def export(self, name: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """A zero-filled tensor other processes can open (where :attr:`sharing` is set): through
        Paddle's IPC where :attr:`ipc_methods` names it, with :meth:`on_device` around the export."""
        if self.ipc_methods is None:
            raise self._unshareable(name)
        in_force = self.memory_ipc()
        if in_force is not None and not in_force.flag.paddle_ipc_covers:
            raise CacheSharingError(
                f"KV cache tensor {name} would live in Paddle's {in_force.flag.generation} allocator: "
                f"{in_force.said()}. Its memory is shared through {in_force.flag.ipc}, which no protocol of "
                f"fd-platforms carries (nothing was exported). Fix: {in_force.fix()}"
            )
        share = self.ipc_methods[0]
        shared = share_ipc_tensor(self.paddle, name, shape, dtype, device, share, on_device=self.on_device(device))
        if self._vmm_on() and len(decode_handle(shared.handle)) != VMM_FIELDS:
            shared.close()
            raise CacheSharingError(
                f"KV cache tensor {name} lives in Paddle's virtual-memory allocator ({self.vmm_flag} is on), but this "
                f"Paddle build's {share} gave a legacy IPC handle, which does not cover such memory. Fix: set "
                f"{self.vmm_flag}=0 in every process of the engine, or use a Paddle build whose IPC shares VMM memory"
            )
        return shared

    def open(self, name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
        """Open a tensor another process exported (where :attr:`sharing` is set), with ``device`` current.

        ``handle`` is Paddle's IPC metadata as :meth:`export` gives it, or a raw 64-byte IPC handle
        (``ipc64:``, from FastDeploy's per-tensor record), which names an allocation holding the tensor
        from its start: opened as Paddle's metadata for that allocation."""
        if self.ipc_methods is None:
            raise self._unshareable(name)
        raw = handle_bytes(handle)
        if raw is not None:
            handle = metadata_of_raw_handle(raw, shape, dtype, device)
        if self.vmm_flag is not None and len(decode_handle(handle)) == VMM_FIELDS and not self._vmm_on():
            raise CacheSharingError(
                f"KV cache tensor {name} was exported from Paddle's virtual-memory allocator ({self.vmm_flag} on in "
                f"its creator), but it is off here, and Paddle opens such handles only with it on. Fix: set the same "
                f"{self.vmm_flag} in every process of the engine"
            )
        opener = self.on_device(device) or (lambda call: call())
        new_shared = self.ipc_methods[1]
        return opener(lambda: open_ipc_tensor(self.paddle, name, handle, shape, dtype, new_shared))

    def on_device(self, device: str) -> OnDevice | None:
        """How to run a Paddle call with ``device`` current (through :attr:`current_device_calls`),
        restoring the previous device after; None where this device's IPC does not depend on it."""
        if self.current_device_calls is None:
            return None
        get_name, set_name = self.current_device_calls
        getter, setter = paddle_attribute(self.paddle, get_name), paddle_attribute(self.paddle, set_name)
        wanted = device_index(device)

        def run(call: Callable[[], Any]) -> Any:
            previous = int(getter())
            if previous == wanted:
                return call()
            if setter is None:
                raise CacheSharingError(
                    f"{device} is not this process's current {self.device_type} device ({previous} is), and this "
                    f"Paddle build has no paddle.{set_name} to switch (its IPC would label the "
                    f"tensor with device {previous}). Fix: start each rank in its own process with "
                    f"{self.visible_devices_env} naming its device, so it is device 0, or use a newer Paddle build"
                )
            setter(wanted)
            try:
                return call()
            finally:
                setter(previous)

        return run

    def release(self, device: str) -> str | None:
        """Return the allocator's cached memory to the device (after a cache was freed); what was called."""
        if self.empty_cache_call is None:
            return None
        paddle_attribute(self.paddle, self.empty_cache_call)()  # covers every device this process selected
        return f"paddle.{self.empty_cache_call}()"

    def memory_ipc(self) -> FlagReading | None:
        """Which of :attr:`allocator_flags` (and :attr:`vmm_flag`) is on in this process, read from Paddle before
        anything is allocated: the first that is, or None where none is (a flag the build lacks counts as off), so
        the device's memory gets its plain IPC handles."""
        names = dict.fromkeys((*self.allocator_flags, *((self.vmm_flag,) if self.vmm_flag else ())))
        readings = (read_flag(self.paddle, known_flag(name)) for name in names)
        return next((reading for reading in readings if reading is not None and reading.on), None)

    def _vmm_on(self) -> bool:
        """Whether this process runs Paddle's VMM allocator of :attr:`vmm_flag` (a flag the build lacks counts as
        off)."""
        if self.vmm_flag is None:
            return False
        try:
            return bool(self.paddle.get_flags([self.vmm_flag])[self.vmm_flag])
        except (ValueError, KeyError):
            return False

    def _unshareable(self, name: str) -> CacheSharingError:
        return CacheSharingError(
            f"{self.device_type} tensors cannot be shared between processes (tensor {name}): {self.no_sharing}. "
            "Fix: let the workers create their own caches"
        )


def known_flag(name: str) -> AllocatorFlag:
    """The kit's record of allocator flag ``name``; a ConfigError naming it where the kit knows no such flag."""
    flag = PADDLE_ALLOCATOR_FLAGS.get(name)
    if flag is None:
        raise ConfigError(
            "allocator_flags",
            name,
            f"one of {', '.join(PADDLE_ALLOCATOR_FLAGS)}",
            "declare only flags whose IPC the kit knows, or add the flag's record to fd_platforms.kit.allocator_flags",
        )
    return flag


#: Runs a Paddle call with the tensor's device current (CUDA's IPC export needs it).
OnDevice = Callable[[Callable[[], Any]], Any]
VMM_FIELDS = 5  # Paddle's IPC metadata of VMM memory: (blob, dtype, dims, lod, device) ...
IPC_FIELDS = 7  # ... and of other device memory: (handle, offset, size, dtype, dims, lod, device)
PADDLE_UINT8 = 2  # the dtype field of uint8: phi::DataType::UINT8, int(paddle.uint8) (tested against Paddle)


def paddle_attribute(paddle: Any, dotted: str) -> Any:
    """``paddle.<dotted>`` (``"base.core.get_cuda_current_device_id"``), or None where this build lacks it."""
    node = paddle
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node


def share_ipc_tensor(
    paddle: Any,
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    device: str,
    share: str,
    *,
    on_device: OnDevice | None = None,
) -> SharedTensor:
    """A zero-filled device tensor exported through Paddle's own IPC (what ``paddle.incubate.multiprocessing``
    uses): raw ``uint8`` allocated on ``device``, its DenseTensor's ``share`` method (``_share_cuda``,
    ``_share_xpu``) gives the handle's metadata; ``on_device`` runs that call with ``device`` current."""
    raw = paddle.zeros(list(byte_shape(shape, dtype)), dtype="uint8", device=device)
    dense = raw.get_tensor()
    metadata = (on_device or (lambda call: call()))(getattr(dense, share))
    return shared_view(name, raw, shape, dtype, encode_handle(metadata), exported=True)


def open_ipc_tensor(
    paddle: Any, name: str, handle: str, shape: tuple[int, ...], dtype: str, new_shared: str
) -> SharedTensor:
    """The tensor another process exported with :func:`share_ipc_tensor`, opened through Paddle's IPC
    (``DenseTensor._new_shared_cuda``, ``_new_shared_xpu``) and viewed as ``dtype``: the same device memory."""
    try:
        dense = getattr(paddle.base.core.DenseTensor, new_shared)(decode_handle(handle))
    except (RuntimeError, OSError, ValueError) as exc:
        raise CacheSharingError(
            f"KV cache tensor {name} cannot be opened from its IPC handle: {type(exc).__name__}: {exc}. "
            "Fix: attach while the cache manager holds the cache, on the same machine"
        ) from None
    raw = paddle.base.core.eager.Tensor()
    raw.get_tensor()._share_data_with(dense)
    return shared_view(name, raw, shape, dtype, handle, exported=False)


def device_index(device: str) -> int:
    """The index of ``<type>:<index>`` (0 for a device string without one)."""
    return int(device.rpartition(":")[2] or 0)


def byte_shape(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """``shape`` of ``dtype`` as ``uint8``: the last extent times the dtype's size."""
    return (*shape[:-1], shape[-1] * DTYPE_BYTES[dtype])


def write_element(tensor: Any, position: tuple[int, ...], value: int) -> None:
    """``tensor[position] = value``, written into the tensor's own memory on every device.

    The value is copied into a one-element view (``copy_``): an item assignment may give the tensor
    new memory instead where the device has no kernel of its own (Paddle's CPU fallback on a custom
    device), leaving a shared cache's memory unwritten."""
    paddle = import_paddle()
    *outer, inner = position
    one = paddle.to_tensor([value], dtype=tensor.dtype, place=paddle.CPUPlace())
    view = (*outer, slice(inner, inner + 1))  # the element as a one-element view
    tensor[view].copy_(one, True)


def shared_view(
    name: str, raw: Any, shape: tuple[int, ...], dtype: str, handle: str, *, exported: bool
) -> SharedTensor:
    """``raw`` (``uint8`` of :func:`byte_shape`) viewed as ``dtype``, held by a SharedTensor whose close drops it."""
    holder = [raw if dtype == "uint8" else raw.view(dtype)]
    return SharedTensor(
        name=name,
        tensor=holder[0],
        handle=handle,
        nbytes=tensor_bytes(shape, dtype),
        exported=exported,
        _close=holder.clear,
    )


def data_address(tensor: Any) -> int | None:
    """Where ``tensor``'s data starts in this process (Paddle's ``Tensor.data_ptr()``); None for a tensor
    object without ``data_ptr`` (a plugin's own kind)."""
    data_ptr = getattr(tensor, "data_ptr", None)
    return None if data_ptr is None else int(data_ptr())


def encode_handle(metadata: object) -> str:
    """Paddle's IPC metadata (a tuple of bytes, ints and lists) as JSON text; bytes in base64."""

    def plain(item: object) -> object:
        if isinstance(item, bytes):
            return {"b64": base64.b64encode(item).decode()}
        if isinstance(item, (tuple, list)):
            return [plain(part) for part in item]
        return item

    return json.dumps(plain(metadata), separators=(",", ":"))


def raw_ipc_handle(name: str, handle: str) -> bytes | None:
    """The raw 64-byte IPC handle inside Paddle's IPC metadata ``handle`` (what FastDeploy's per-tensor
    record holds: its ``set_data_ipc`` writes the IPC handle of the tensor's data, a ``cudaIpcMemHandle_t``
    on CUDA, an ``XPUIpcMemHandle`` on XPU), or None where ``handle`` is not such metadata. A
    :class:`~fd_platforms.contract.errors.CacheSharingError` where it is, but a raw handle
    cannot stand for it: VMM memory (another kind of handle), or a tensor that starts inside its
    allocation (a raw handle names the allocation, and FastDeploy's opener reads from its start)."""
    try:
        fields = json.loads(handle)
    except ValueError:
        return None
    if not isinstance(fields, list) or len(fields) not in (IPC_FIELDS, VMM_FIELDS):
        return None
    metadata = decode_handle(handle)
    if not isinstance(metadata[0], bytes):
        return None
    if len(metadata) == VMM_FIELDS:
        raise CacheSharingError(
            f"KV cache tensor {name} lives in Paddle's virtual-memory allocator (its IPC handle is a VMM one), and "
            "FastDeploy's record holds only a legacy IPC handle. Fix: set FLAGS_use_virtual_memory_auto_growth=0 "
            "in every process of the engine, or use the fd-platforms protocol (the default)"
        )
    raw, offset = metadata[0], metadata[1]
    if len(raw) != HANDLE_BYTES:
        return None
    if offset:
        raise CacheSharingError(
            f"KV cache tensor {name} starts {offset} bytes into its device allocation, and FastDeploy's record holds "
            "only the allocation's handle (its opener reads from the allocation's start). Fix: use the fd-platforms "
            "protocol (the default), whose handle carries the offset"
        )
    return raw


def metadata_of_raw_handle(raw: bytes, shape: tuple[int, ...], dtype: str, device: str) -> str:
    """Paddle's IPC metadata (as :func:`encode_handle` text) for a raw IPC handle whose allocation holds a
    tensor of ``shape`` and ``dtype`` from its start, opened on ``device`` as raw ``uint8``."""
    nbytes, dims = tensor_bytes(shape, dtype), list(byte_shape(shape, dtype))
    return encode_handle((raw, 0, nbytes, PADDLE_UINT8, dims, [], device_index(device)))


def decode_handle(handle: str) -> tuple[Any, ...]:
    """The metadata :func:`encode_handle` wrote, as the tuple Paddle's ``_new_shared_*`` takes."""

    def restore(item: object) -> object:
        if isinstance(item, dict) and set(item) == {"b64"}:
            return base64.b64decode(item["b64"])
        if isinstance(item, list):
            return [restore(part) for part in item]
        return item

    try:
        decoded = json.loads(handle)
    except ValueError:
        raise CacheSharingError(
            f"IPC handle {handle[:60]!r} is not JSON. Fix: pass the exporter's handle as published"
        ) from None
    return tuple(restore(item) for item in decoded)


def pinned_tensor_buffer(paddle: Any, nbytes: int, place_name: str, kind: str) -> HostBuffer:
    """``nbytes`` of pinned host memory held by a ``uint8`` Paddle tensor on ``paddle.<place_name>()``.

    A Paddle build that cannot make the place (``CUDAPinnedPlace`` on the CPU build) raises
    :class:`~fd_platforms.kit.host_memory.PinningUnavailable`; a failed allocation raises ``HostAllocError`` naming the
    size. Releasing the buffer drops the tensor, which returns the memory to Paddle's allocator.
    """
    try:
        place = getattr(paddle, place_name)()
    except RuntimeError as exc:
        raise PinningUnavailable(f"paddle.{place_name}() is not available in this paddle build: {exc}") from exc
    try:
        tensor = paddle.empty([nbytes], dtype="uint8", device=place)
    except (RuntimeError, MemoryError, OSError) as exc:
        raise HostAllocError(
            f"paddle could not allocate {nbytes} bytes of pinned host memory on {place_name}: {exc}. "
            "Fix: ask for less (smaller swap_space) or free host memory"
        ) from exc
    holder = [tensor]
    return HostBuffer(address=int(tensor.data_ptr()), nbytes=nbytes, pinned=True, kind=kind, _free=holder.clear)
