"""The host swap cache: the layout's tensors in host memory, named and ordered as on the device.

FastDeploy's cache-transfer manager keeps one host buffer per layer and role
(``key_caches_{layer}_rank{rank}``, ...). Here the whole rank's swap space is one ``host_alloc``
(pinned where the platform pins), and each tensor is a zero-copy view carved from it at a 64-byte
aligned offset, with the device tensor's block shape and dtype and ``num_cpu_blocks`` blocks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..contract.dlpack import from_dlpack
from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..contract.paddle_import import import_paddle
from ..contract.types import DTYPE_BYTES, HostBuffer
from ..rules.layout import CacheLayout
from .kv_cache import check_platform_and_layout

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..loading.platform import Platform

ALIGNMENT = 64
#: FastDeploy's switch (``fastdeploy/envs.py``, default 0): whether a clear frees the host swap space too.
ENV_SWAP_CLEARING = "FD_ENABLE_SWAP_SPACE_CLEARING"


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


def swap_space_clearing(clear_host: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a cache manager's clear frees its host swap space: ``clear_host`` where given, else
    :data:`ENV_SWAP_CLEARING` as FastDeploy reads it (an integer, 0 or unset: keep the swap space; FastDeploy's
    ``CacheTransferManager.check_cache_status`` in ``fastdeploy/cache_manager/cache_transfer_manager.py``
    frees its cpu caches on CLEARING only with it set, and keeps ``swap_space_ready_signal`` at 1 otherwise).
    A value that is no integer is a ConfigError naming the variable."""
    if clear_host is not None:
        if not isinstance(clear_host, bool):
            raise ConfigError(
                "clear_host",
                clear_host,
                "None, True or False",
                f"pass True to free the host swap space, False to keep it, None to follow {ENV_SWAP_CLEARING}",
            )
        return clear_host
    raw = (os.environ if environ is None else environ).get(ENV_SWAP_CLEARING, "0")
    try:
        return int(raw) != 0  # FastDeploy: int(os.getenv("FD_ENABLE_SWAP_SPACE_CLEARING", "0"))
    except ValueError:
        raise ConfigError(
            ENV_SWAP_CLEARING,
            raw,
            "an integer: 0 (keep the host swap space across a clear, the default) or 1 (free it)",
            f"export {ENV_SWAP_CLEARING}=0 or =1, as FastDeploy reads it",
        ) from None


def check_host_cache(host: HostCache, layout: CacheLayout, num_blocks: int) -> None:
    """``host``, a kept host swap cache (a :class:`HostCache`: the :class:`~.request.CacheRequest` refuses anything
    else), as one :func:`allocate_host_cache` would make for ``layout`` and ``num_blocks`` blocks (names, blocks and
    bytes), not yet freed; a ConfigError naming what differs."""
    expected = (layout.host_names(), num_blocks, host_offsets(layout, num_blocks)[1])
    found = (host.names, host.num_blocks, host.nbytes)
    if found != expected or host.buffer.released or not host.tensors:
        state = "freed" if host.buffer.released or not host.tensors else f"{found[1]} blocks, {found[2]} bytes"
        raise ConfigError(
            "host_cache",
            f"HostCache of {len(found[0])} tensors ({state})",
            f"the host swap cache of this layout: {len(expected[0])} tensors named like "
            f"{expected[0][0]}, {num_blocks} blocks, {expected[2]} bytes, not freed",
            "pass the host cache the cleared ManagedCache kept (its .host), with the same layout and num_cpu_blocks",
        )


def host_offsets(layout: CacheLayout, num_blocks: int) -> tuple[list[int], int]:
    """Each tensor's byte offset in the swap buffer (64-byte aligned) and the buffer's size."""
    offsets, end = [], 0
    for spec in layout.tensors:
        start = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(start)
        end = start + num_blocks * spec.bytes_per_block
    return offsets, end


def allocate_host_cache(platform: Platform, layout: CacheLayout, num_blocks: int) -> HostCache:
    """``num_blocks`` host swap blocks of every tensor of ``layout``, in one host allocation (the platform's
    ``host_alloc``: pinned where it pins), each tensor a view named as FastDeploy's transfer manager names its
    cpu caches (``key_caches_{layer}_rank{rank}``). What a cache manager carves
    (:func:`~fd_platforms.engine.initialize.manage_kv_cache`); a port that keeps its own manager calls it directly.
    ``HostCache.clear()`` frees it.

    The arguments are checked before any hook runs: a ConfigError naming the platform, the layout or
    ``num_cpu_blocks`` (at least 1)."""
    check_platform_and_layout(platform, layout)
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
        tensor = from_dlpack(paddle, raw)
        tensors.append(tensor if spec.dtype == "uint8" else tensor.view(spec.dtype))
    del whole, raw
    return HostCache(layout.host_names(), tensors, num_blocks, buffer)
