"""One rank's KV cache tensors, allocated on a device through Paddle in the layout's order.

This is the creator path: a worker (or the cache manager) allocates every tensor of
:class:`~fd_platforms.layout.CacheLayout` for ``num_blocks`` blocks. Each tensor is allocated as
raw ``uint8`` and viewed as its dtype (zero-copy), so every cache dtype, fp8 included, takes the
same path on every device. The order and names are the layout's contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .device_facts import import_paddle
from .errors import ConfigError, DeviceAllocError
from .layout import DTYPE_BYTES, CacheLayout, CacheTensorSpec
from .sizes import format_size


@dataclass
class KVCache:
    """The allocated cache: ``tensors[i]`` is named ``names[i]``, in the layout's order."""

    device: str
    num_blocks: int
    names: tuple[str, ...]
    tensors: list[Any] = field(repr=False)
    nbytes: int

    def by_name(self) -> dict[str, Any]:
        """The tensors keyed by name (for lookups; kernels index :attr:`tensors` by position)."""
        return dict(zip(self.names, self.tensors, strict=True))

    def release(self) -> None:
        """Drop every tensor, returning the memory to Paddle's allocator."""
        self.tensors.clear()


#: Called after each tensor with (bytes allocated so far, bytes in all).
AllocationProgress = Callable[[int, int], None]


def allocate_kv_cache(
    layout: CacheLayout,
    num_blocks: int,
    device: str,
    paddle: Any = None,
    *,
    progress: AllocationProgress | None = None,
) -> KVCache:
    """Allocate ``layout``'s tensors for ``num_blocks`` blocks on ``device`` (``"cpu"``, ``"gpu:0"``).

    Raises :class:`DeviceAllocError` naming the tensor, its size and the device when Paddle
    cannot allocate it; tensors allocated before it are dropped first. ``progress`` is called
    after every tensor (throttling is the caller's).
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
        raise ConfigError("num_blocks", num_blocks, "an int > 0", "plan the blocks first (max_num_blocks)")
    paddle = import_paddle() if paddle is None else paddle
    tensors: list[Any] = []
    total = 0
    expected = num_blocks * layout.bytes_per_block
    for spec in layout.tensors:
        shape = spec.shape(num_blocks)
        nbytes = num_blocks * spec.bytes_per_block
        try:
            tensors.append(_allocate_tensor(paddle, spec, shape, device))
        except (RuntimeError, MemoryError, OSError, ValueError) as exc:
            done = len(tensors)
            tensors.clear()
            first_line = next(iter(str(exc).strip().splitlines()), "")
            raise DeviceAllocError(
                f"could not allocate KV cache tensor {spec.name} {list(shape)} {spec.dtype} ({format_size(nbytes)}) "
                f"on {device} after {done} of {len(layout.tensors)} tensors ({format_size(total)}): "
                f"{type(exc).__name__}: {first_line}. "
                "Fix: plan fewer blocks (lower memory_utilization or num_gpu_blocks_override) or free device memory"
            ) from exc
        total += nbytes
        if progress is not None:
            progress(total, expected)
    return KVCache(device=device, num_blocks=num_blocks, names=layout.names(), tensors=tensors, nbytes=total)


def _allocate_tensor(paddle: Any, spec: CacheTensorSpec, shape: tuple[int, ...], device: str) -> Any:
    """One tensor as raw bytes viewed as its dtype (kept out of the caller's frame, so an error's
    traceback holds no tensor)."""
    raw = paddle.empty([*shape[:-1], shape[-1] * DTYPE_BYTES[spec.dtype]], dtype="uint8", device=device)
    return raw if spec.dtype == "uint8" else raw.view(getattr(paddle, spec.dtype))
