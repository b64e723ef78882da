"""Typed records that hooks return and the core reports. Importing this module never imports paddle.

Every record checks its fields when it is built: a field of the wrong type (``"80GiB"`` or
``8.0e10`` for a byte count, ``"no"`` for a bool) or out of range is a
:class:`~fd_platforms.contract.errors.RecordError` naming the record, the field, the value and what is
allowed. Counts of bytes, blocks and elements are ints from 0 (or 1) to
:data:`~fd_platforms.contract.integers.MAX_COUNT` (``2**63 - 1``).
"""

from __future__ import annotations

import ctypes
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from .errors import BufferInUseError, ExtraNotInstalledError, RecordError
from .integers import MAX_COUNT, SHAPE_ALLOWED, check_int, is_shape

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy
    import paddle
    from typing_extensions import Self  # typing.Self is Python 3.11's


def _check_type(record: object, name: str, kind: type | tuple[type, ...], allowed: str) -> None:
    value = getattr(record, name)
    if not isinstance(value, kind):
        raise RecordError(type(record).__name__, name, value, allowed)


def _check_text(record: object, name: str, *, optional: bool = False, empty: bool = True) -> None:
    value = getattr(record, name)
    if optional and value is None:
        return
    if not isinstance(value, str) or (not empty and not value.strip()):
        text = "a non-empty str" if not empty else "a str"
        raise RecordError(type(record).__name__, name, value, f"None or {text}" if optional else text)


def _check_choice(record: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(record, name)
    if not isinstance(value, str) or value not in choices:
        raise RecordError(type(record).__name__, name, value, f"one of {', '.join(choices)}")


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

    def __post_init__(self) -> None:
        _check_text(self, "name", empty=False)
        _check_text(self, "device_type", empty=False)
        _check_text(self, "visible_devices_env", optional=True, empty=False)
        _check_text(self, "description")

    def device_string(self, device_id: int) -> str:
        """Paddle's device string for a local device id: ``gpu:0``; ``cpu`` has no id."""
        return self.device_type if self.device_type == "cpu" else f"{self.device_type}:{device_id}"


@dataclass(frozen=True)
class Detection:
    """Whether a platform can run on this machine, why, and how many devices it sees."""

    available: bool
    reason: str
    device_count: int = 0

    def __post_init__(self) -> None:
        _check_type(self, "available", bool, "True or False")
        _check_text(self, "reason")
        check_int("device_count", self.device_count, 0, record="Detection")


DecidingTerm = Literal["profile", "num_cpu_blocks", "storage_backend", "splitwise_role", "none"]


@dataclass(frozen=True)
class CacheDecision:
    """Answer of ``should_create_cache_tensor``: create locally or attach, and which rule term decided."""

    create: bool
    deciding_term: DecidingTerm
    reason: str

    def __post_init__(self) -> None:
        _check_type(self, "create", bool, "True or False")
        _check_choice(self, "deciding_term", get_args(DecidingTerm))
        _check_text(self, "reason")


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

    def __post_init__(self) -> None:
        check_int("total_bytes", self.total_bytes, 1, record="DeviceMemory")
        for name in ("free_bytes", "process_bytes"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0, what="None or an integer", record="DeviceMemory")
        _check_text(self, "source")
        if self.free_bytes is not None and self.free_bytes > self.total_bytes:
            raise RecordError("DeviceMemory", "free_bytes", self.free_bytes, f"at most total_bytes={self.total_bytes}")


LimitKind = Literal["max_tensor_elements", "max_num_blocks"]


@dataclass(frozen=True)
class PlatformLimit:
    """A limit a platform declares for the KV cache, with the reason it exists.

    ``kind`` ``max_tensor_elements``: the most elements one cache tensor may hold (e.g. kernels
    using 32-bit element offsets: ``2**31 - 1``); ``max_num_blocks``: the most blocks in all.
    """

    kind: LimitKind
    value: int
    reason: str

    def __post_init__(self) -> None:
        _check_choice(self, "kind", get_args(LimitKind))
        check_int("value", self.value, 1, record="PlatformLimit")
        _check_text(self, "reason", empty=False)


Binding = Literal["memory", "platform_limit", "override"]


@dataclass(frozen=True)
class Plan:
    """Answer of ``max_num_blocks``: how many KV cache blocks one rank gets, and why.

    ``memory_blocks`` is ``budget_bytes // bytes_per_block``; ``num_blocks`` differs from it only
    when a declared limit or an override binds, which ``binding`` and ``binding_reason`` say.
    ``bytes_per_block`` is the per-rank figure used for device and host swap blocks alike.
    ``num_draft_blocks`` is what each MTP draft layer holds on the device, ``int(num_blocks *
    num_gpu_block_expand_ratio)`` as FastDeploy's proposer allocates (0: the layout has no draft layer).
    """

    num_blocks: int
    memory_blocks: int
    bytes_per_block: int
    block_size: int
    budget_bytes: int
    binding: Binding
    binding_reason: str
    num_cpu_blocks: int
    num_draft_blocks: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_blocks",
            "memory_blocks",
            "bytes_per_block",
            "block_size",
            "num_cpu_blocks",
            "num_draft_blocks",
        ):
            check_int(name, getattr(self, name), 0, record="Plan")
        check_int("budget_bytes", self.budget_bytes, -MAX_COUNT, note="negative when nothing fits", record="Plan")
        _check_choice(self, "binding", get_args(Binding))
        _check_text(self, "binding_reason")

    @property
    def tokens(self) -> int:
        """Tokens whose KV cache fits in ``num_blocks``."""
        return self.num_blocks * self.block_size


@dataclass(eq=False)
class SharedTensor:
    """One KV cache tensor that crosses processes: returned by ``export_cache_tensor`` (the
    creator's) and ``open_cache_tensor`` (an attacher's, the same memory, not a copy).

    ``tensor`` is the Paddle tensor with the asked shape and dtype; ``handle`` the text another
    process passes to ``open_cache_tensor`` to open it (its meaning is the platform's: a memfd,
    a CUDA IPC handle, ...); ``nbytes`` its size. :meth:`close` drops this process's hold: the
    tensor, its mapping or handle. Memory returns to the system once every process has closed
    it (or exited). :meth:`close` refuses while other references to the tensor are alive.
    """

    name: str
    tensor: Any = field(repr=False)
    handle: str
    nbytes: int
    exported: bool
    _close: Callable[[], None] = field(repr=False)
    closed: bool = False
    _close_when_unused: Callable[[Callable[[], None]], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_text(self, "name", empty=False)
        _check_text(self, "handle", empty=False)
        check_int("nbytes", self.nbytes, 1, record="SharedTensor")
        _check_type(self, "exported", bool, "True or False")
        if not callable(self._close):
            raise RecordError("SharedTensor", "_close", self._close, "a callable that drops this process's hold")
        if self._close_when_unused is not None and not callable(self._close_when_unused):
            raise RecordError(
                "SharedTensor",
                "_close_when_unused",
                self._close_when_unused,
                "None or a callable that drops the hold once nothing references the tensor",
            )

    def close(self) -> None:
        """Drop this process's hold on the tensor; a second call does nothing."""
        if self.closed:
            return
        self.tensor = None
        self._close()
        self.closed = True

    def release(self, then: Callable[[], None]) -> None:
        """Drop this record's reference now and this process's hold once nothing in it references the
        tensor any more (the engine may still): ``then`` runs once the hold is dropped, at once where nothing
        references it. A platform whose ``close`` needs no waiting (Paddle's IPC tensors live as long as
        their last reference) gives no ``_close_when_unused``: its close runs now. Never unmaps memory a
        live tensor points at. A second call (or one after :meth:`close`) runs ``then`` at once."""
        if self.closed:
            then()
            return
        self.tensor = None
        self.closed = True
        if self._close_when_unused is None:
            self._close()
            then()
        else:
            self._close_when_unused(then)


DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int8": 1, "uint8": 1, "float32": 4}
"""The dtypes a cache tensor may have, and the bytes of one element."""

CacheRole = Literal["key", "value", "key_scale", "value_scale", "indexer"]
AttentionKind = Literal["mha", "gqa", "mla", "dsa"]


@dataclass(frozen=True)
class CacheRoleShape:
    """One cache tensor of a layer as a platform allocates it: its role, its whole shape for the
    blocks asked for (the block axis first) and its dtype."""

    role: CacheRole
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        _check_choice(self, "role", get_args(CacheRole))
        if not is_shape(self.shape):
            raise RecordError("CacheRoleShape", "shape", self.shape, SHAPE_ALLOWED)
        _check_choice(self, "dtype", tuple(DTYPE_BYTES))

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class CacheShapeRequest:
    """What ``kv_cache_shapes`` is asked: one layer's cache tensors for ``num_blocks`` blocks.

    ``attention`` is the layer kind; ``quant_type`` the ``kv_cache_quant_type`` (``none``,
    ``block_wise_fp8``, ``int4_zp``); ``cache_dtype`` the configured cache dtype; ``kv_heads`` the
    key/value heads of one rank and ``head_dim`` their width (1 and the latent width for MLA/DSA).
    ``default`` is the core's answer, role by role in contract order: a platform answers the same
    roles, in the same order, each with the same bytes — it may reorder axes and choose a dtype of
    the same size.
    """

    attention: AttentionKind
    quant_type: str
    cache_dtype: str
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    default: tuple[CacheRoleShape, ...]

    def __post_init__(self) -> None:
        _check_choice(self, "attention", get_args(AttentionKind))
        _check_text(self, "quant_type", empty=False)
        _check_text(self, "cache_dtype", empty=False)
        for name in ("num_blocks", "block_size", "kv_heads", "head_dim"):
            check_int(name, getattr(self, name), 1, record="CacheShapeRequest")
        if not isinstance(self.default, tuple) or not all(isinstance(role, CacheRoleShape) for role in self.default):
            raise RecordError("CacheShapeRequest", "default", self.default, "a tuple of CacheRoleShape")


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

    def __post_init__(self) -> None:
        check_int("address", self.address, 1, record="HostBuffer")
        check_int("nbytes", self.nbytes, 1, record="HostBuffer")
        _check_type(self, "pinned", bool, "True or False")
        _check_text(self, "kind", empty=False)
        if not callable(self._free):
            raise RecordError("HostBuffer", "_free", self._free, "a callable that frees the memory")

    def numpy(self) -> numpy.ndarray:
        """A zero-copy ``numpy.uint8`` view of the whole buffer (numpy: the extra ``numpy``, or Paddle's own)."""
        try:
            import numpy as np
        except ModuleNotFoundError:
            raise ExtraNotInstalledError("numpy", "numpy", "HostBuffer.numpy()") from None

        self._check_live()
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.address)
        view = np.frombuffer(memoryview(raw), dtype=np.uint8)
        self._views.append(weakref.ref(view))
        return view

    def paddle(self) -> paddle.Tensor:
        """A zero-copy ``paddle.uint8`` CPU tensor over the buffer (through DLPack)."""
        from .dlpack import from_dlpack
        from .paddle_import import import_paddle

        return from_dlpack(import_paddle(), self.numpy())

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
