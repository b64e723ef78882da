"""Cache shapes a platform's attention kernels may want, ready for its ``kv_cache_shapes`` hook.

Each function takes the hook's :class:`~fd_platforms.contract.types.CacheShapeRequest` and returns
the roles for it, or None where the core's shapes stand (the hook then answers None). They move
axes and rename dtypes of the same size only, so every answer keeps the core's bytes.
"""

from __future__ import annotations

from ..contract.types import CacheRoleShape, CacheShapeRequest
from ..rules.config.limits import EIGHT_BIT_DTYPES


def tokens_before_heads(request: CacheShapeRequest) -> tuple[CacheRoleShape, ...] | None:
    """A flash-attention layout for MHA/GQA: key and value ``[N, block_size, kv_heads, head_dim]``,
    block-wise fp8 scales the key's first three axes ``[N, block_size, kv_heads]``. ``int4_zp`` and
    latent (MLA/DSA) caches keep the core's shapes."""
    if request.attention not in ("mha", "gqa") or request.quant_type == "int4_zp":
        return None
    return tuple(
        CacheRoleShape(role.role, (role.shape[0], role.shape[2], role.shape[1], *role.shape[3:]), role.dtype)
        for role in request.default
    )


def eight_bit_as_int8(request: CacheShapeRequest) -> tuple[CacheRoleShape, ...] | None:
    """An 8-bit cache (fp8, int8) allocated as ``int8`` where the core allocates ``uint8``; the packed
    DSA cache and ``int4_zp`` keep ``uint8``."""
    if request.cache_dtype not in EIGHT_BIT_DTYPES or request.attention == "dsa" or request.quant_type == "int4_zp":
        return None
    return tuple(
        CacheRoleShape(role.role, role.shape, "int8" if role.dtype == "uint8" else role.dtype)
        for role in request.default
    )
