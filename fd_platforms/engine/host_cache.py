"""The host swap cache: the layout's tensors in host memory, named and ordered as on the device.

FastDeploy's cache-transfer manager keeps one host buffer per layer and role
(``key_caches_{layer}_rank{rank}``, ...). Here the whole rank's swap space is one ``host_alloc``
(pinned where the platform pins), and each tensor is a zero-copy view carved from it at a 64-byte
aligned offset, with the device tensor's block shape and dtype and ``num_cpu_blocks`` blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.integers import check_int
from ..contract.paddle_import import import_paddle
from ..contract.types import HostBuffer
from ..rules.layout import DTYPE_BYTES, CacheLayout

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..loading.platform import Platform

ALIGNMENT = 64


@dataclass(eq=False)
class HostCache:
    """One rank's host swap cache: ``tensors[i]`` is named ``names[i]``, carved from ``buffer``."""

    names: tuple[str, ...]
    tensors: list[Any] = field(repr=False)
    num_blocks: int
    buffer: HostBuffer

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    @property
    def pinned(self) -> bool:
        return self.buffer.pinned

    def by_name(self) -> dict[str, Any]:
        return dict(zip(self.names, self.tensors, strict=True))

    def clear(self) -> None:
        """Drop the views and free the host memory (refused while other views of it live). Idempotent."""
        self.tensors.clear()
        self.buffer.release()


def host_offsets(layout: CacheLayout, num_blocks: int) -> tuple[list[int], int]:
    """Each tensor's byte offset in the swap buffer (64-byte aligned) and the buffer's size."""
    offsets, end = [], 0
    for spec in layout.tensors:
        start = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(start)
        end = start + num_blocks * spec.bytes_per_block
    return offsets, end


def allocate_host_cache(platform: Platform, layout: CacheLayout, num_blocks: int) -> HostCache:
    """``num_blocks`` host swap blocks of every tensor of ``layout``, in one host allocation."""
    check_int("num_cpu_blocks", num_blocks, 1, fix="pass the plan's num_cpu_blocks")
    offsets, total = host_offsets(layout, num_blocks)
    buffer = platform.host_alloc(total)
    paddle = import_paddle()
    whole = buffer.numpy()
    tensors = []
    for spec, offset in zip(layout.tensors, offsets, strict=True):
        shape = spec.host_shape(num_blocks)
        raw = whole[offset : offset + num_blocks * spec.bytes_per_block].reshape(
            *shape[:-1], shape[-1] * DTYPE_BYTES[spec.dtype]
        )
        tensor = paddle.from_dlpack(raw)
        tensors.append(tensor if spec.dtype == "uint8" else tensor.view(spec.dtype))
    del whole, raw
    return HostCache(layout.host_names(), tensors, num_blocks, buffer)
