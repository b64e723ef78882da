"""Typed records that hooks return and the core reports. Importing this module never imports paddle."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import BufferInUseError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy
    import paddle


@dataclass(frozen=True)
class PlatformIdentity:
    """Who a platform is.

    ``name`` is the platform name users pass in ``FD_PLATFORM`` (``cuda``); ``device_type`` the
    Paddle device type string (``gpu``, ``xpu``, ``iluvatar_gpu``, ``metax_gpu``, ``cpu``);
    ``visible_devices_env`` the variable that limits visible devices (None where there is none).
    """

    name: str
    device_type: str
    visible_devices_env: str | None
    description: str = ""

    def device_string(self, device_id: int) -> str:
        """Paddle's device string for a local device id: ``gpu:0``; ``cpu`` has no id."""
        return self.device_type if self.device_type == "cpu" else f"{self.device_type}:{device_id}"


@dataclass(frozen=True)
class Detection:
    """Whether a platform can run on this machine, why, and how many devices it sees."""

    available: bool
    reason: str
    device_count: int = 0


DecidingTerm = Literal["profile", "num_cpu_blocks", "storage_backend", "splitwise_role", "none"]


@dataclass(frozen=True)
class CacheDecision:
    """Answer of ``should_create_cache_tensor``: create locally or attach, and which rule term decided."""

    create: bool
    deciding_term: DecidingTerm
    reason: str


@dataclass(frozen=True)
class DeviceMemory:
    """Memory facts of one device, in bytes.

    ``free_bytes`` is None where the platform cannot tell free memory; ``process_bytes`` is what
    this process already holds on the device (None where unknown); ``source`` says where the
    numbers came from.
    """

    total_bytes: int
    free_bytes: int | None
    process_bytes: int | None
    source: str


@dataclass(frozen=True)
class PlatformLimit:
    """A limit a platform declares for the KV cache, with the reason it exists.

    ``kind`` ``max_tensor_elements``: the most elements one cache tensor may hold (e.g. kernels
    using 32-bit element offsets: ``2**31 - 1``); ``max_num_blocks``: the most blocks in all.
    """

    kind: Literal["max_tensor_elements", "max_num_blocks"]
    value: int
    reason: str


Binding = Literal["memory", "platform_limit", "override"]


@dataclass(frozen=True)
class Plan:
    """Answer of ``max_num_blocks``: how many KV cache blocks one rank gets, and why.

    ``memory_blocks`` is ``budget_bytes // bytes_per_block``; ``num_blocks`` differs from it only
    when a declared limit or an override binds, which ``binding`` and ``binding_reason`` say.
    ``bytes_per_block`` is the per-rank figure used for device and host swap blocks alike.
    """

    num_blocks: int
    memory_blocks: int
    bytes_per_block: int
    block_size: int
    budget_bytes: int
    binding: Binding
    binding_reason: str
    num_cpu_blocks: int

    @property
    def tokens(self) -> int:
        """Tokens whose KV cache fits in ``num_blocks``."""
        return self.num_blocks * self.block_size


SelectedHow = Literal["env", "detected", "fallback"]
PlatformStatus = Literal["available", "unavailable", "broken", "excluded"]


@dataclass(frozen=True)
class PlatformReport:
    """One discovered platform as ``fd-platforms list`` shows it."""

    name: str
    distribution: str
    version: str
    entry_point: str
    builtin: bool
    status: PlatformStatus
    reason: str
    device_count: int = 0
    device_type: str | None = None


@dataclass(eq=False)
class HostBuffer:
    """Host memory returned by ``host_alloc``.

    ``address`` is the first byte, ``nbytes`` the size, ``pinned`` whether the memory is
    page-locked for fast device copies, ``kind`` names the allocator (``pageable``,
    ``cuda_pinned``, ...). :meth:`numpy` and :meth:`paddle` give zero-copy ``uint8`` views.
    :meth:`release` frees the memory; it refuses while a view is still alive, so no view can
    outlive the memory it points at. Use it as a context manager to release on exit.
    """

    address: int
    nbytes: int
    pinned: bool
    kind: str
    _free: Callable[[], None] = field(repr=False)
    _views: list[weakref.ref[Any]] = field(default_factory=list, repr=False)
    released: bool = False

    def numpy(self) -> numpy.ndarray:
        """A zero-copy ``numpy.uint8`` view of the whole buffer."""
        import numpy as np

        self._check_live()
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.address)
        view = np.frombuffer(raw, dtype=np.uint8)
        self._views.append(weakref.ref(view))
        return view

    def paddle(self) -> paddle.Tensor:
        """A zero-copy ``paddle.uint8`` CPU tensor over the buffer (through DLPack)."""
        import paddle

        return paddle.from_dlpack(self.numpy())

    def live_views(self) -> int:
        """How many views of this buffer are still alive."""
        self._views = [ref for ref in self._views if ref() is not None]
        return len(self._views)

    def release(self) -> None:
        """Free the memory; a second call does nothing. Raises BufferInUseError while views live."""
        if self.released:
            return
        alive = self.live_views()
        if alive:
            raise BufferInUseError(
                f"cannot release {self.kind} host buffer of {self.nbytes} bytes at {self.address:#x}: "
                f"{alive} numpy/paddle view(s) still alive. Fix: delete the views first"
            )
        self._free()
        self.released = True

    def _check_live(self) -> None:
        if self.released:
            raise BufferInUseError(
                f"{self.kind} host buffer at {self.address:#x} was already released. "
                "Fix: take views before calling release()"
            )

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
