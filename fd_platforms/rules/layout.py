"""The KV cache layout contract: which tensors one rank holds, in which order, named how.

Layer-major; within a layer the roles ``key``, ``value``, ``key_scale``, ``value_scale``, ``indexer``, those the
attention variant has, each tensor named ``key_caches_{layer}_rank{rank}.device{device}`` (and likewise) as
FastDeploy names it. Each spec gives the shape of one block, and :attr:`CacheLayout.bytes_per_block` is the one
per-rank bytes-per-block figure (device and host swap blocks alike). A layout with MTP layers splits into the
runner's and the proposer's parts (:meth:`CacheLayout.main`, :meth:`CacheLayout.draft`); with MLA the proposer's
``value_caches_{layer}_rank...`` placeholder of shape ``[]`` per draft layer holds no block and is not part of it.
A platform states its own axes through ``kv_cache_shapes`` (:mod:`.shapes`); the bytes stay the core's.

See docs/planning.md, "The layout contract: tensors, shapes and names", for every attention variant's and
quantization's shapes, the layers, parts and names, and the FastDeploy files each follows.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal, cast

from ..contract.errors import ConfigError
from ..contract.integers import INT32_MAX, check_int
from ..contract.types import DTYPE_BYTES, CacheRole, CacheRoleShape
from .config.limits import EIGHT_BIT_DTYPES
from .config.model import ModelConfig, check_tensor_parallel
from .config.settings import CacheConfig, ParallelConfig
from .config.vocabulary import BLOCK_WISE_FP8_WITHOUT_SCALES, int4_zp_storage

Role = CacheRole
#: Which layers of a rank a layout holds: all, the main model's alone, or the MTP draft layers alone.
Part = Literal["all", "main", "draft"]

ROLE_ORDER: tuple[Role, ...] = ("key", "value", "key_scale", "value_scale", "indexer")
NAME_PREFIX: dict[Role, str] = {
    "key": "key_caches",
    "value": "value_caches",
    "key_scale": "key_cache_scales",
    "value_scale": "value_cache_scales",
    "indexer": "indexer_caches",
}


@dataclass(frozen=True)
class LayerRole:
    """One tensor every layer holds: its role, the shape of one block and its dtype."""

    role: Role
    block_shape: tuple[int, ...]
    dtype: str

    @property
    def elements_per_block(self) -> int:
        """Elements one block of this tensor holds."""
        return math.prod(self.block_shape)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block of this tensor takes."""
        return self.elements_per_block * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, kw_only=True)
class CacheTensorSpec(LayerRole):
    """One cache tensor of one layer: a :class:`LayerRole` with its layer and its name.

    ``block_ratio`` is ``num_gpu_block_expand_ratio`` for an MTP layer's tensor on the device (it
    holds ``int(num_blocks * ratio)`` blocks, as FastDeploy's proposer allocates), else 1.
    """

    name: str
    layer: int
    block_ratio: float = 1.0

    def blocks(self, num_blocks: int) -> int:
        """Blocks this tensor holds on the device when the rank has ``num_blocks``."""
        return expanded_blocks(num_blocks, self.block_ratio)

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of this tensor on the device when the rank has ``num_blocks`` blocks."""
        return (self.blocks(num_blocks), *self.block_shape)

    def nbytes(self, num_blocks: int) -> int:
        """Bytes of this tensor on the device when the rank has ``num_blocks`` blocks."""
        return self.blocks(num_blocks) * self.bytes_per_block

    def host_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of this tensor's host swap copy of ``num_blocks`` blocks (every layer alike)."""
        return (num_blocks, *self.block_shape)


@dataclass(frozen=True)
class CacheLayout:
    """All cache tensors of one rank, in the contract order (see the module docstring).

    ``roles`` are the tensors of one layer in the core's shapes, in role order; every one of the
    ``num_layers`` layers holds them. ``rank`` is the local tensor-parallel rank, ``device_id`` the
    device id that names the shared objects (``.device{N}``: the physical id, as FastDeploy names them)
    and ``local_device`` the local device index the tensors are allocated on, exported from and opened
    on (:func:`build_layout` makes it ``device_id`` unless told otherwise).
    The last ``mtp_layers`` layers are MTP layers: on the device they hold ``int(num_blocks *
    mtp_block_ratio)`` blocks (:meth:`device_bytes`, :meth:`blocks_within`).
    ``part`` says which of the rank's layers it holds (:meth:`main`, :meth:`draft`); its layers are
    numbered from ``first_layer`` (the draft's from the main model's layer count, as FastDeploy's).
    ``attention``, ``quant_type``, ``cache_dtype``, ``kv_heads`` and ``head_dim`` are what a
    platform is told when it shapes the layout; ``platform_roles`` (the same roles, the platform's
    axes and dtypes) is set by :meth:`shaped`.
    """

    roles: tuple[LayerRole, ...]
    num_layers: int
    block_size: int
    rank: int = 0
    device_id: int = 0
    """The device id that names the shared objects (``.device{N}``: the physical id, as FastDeploy names them)."""
    local_device: int = 0
    """The local device index the tensors are allocated on, exported from and opened on."""
    attention: str = "gqa"
    quant_type: str = "none"
    cache_dtype: str = "bfloat16"
    kv_heads: int = 1
    head_dim: int = 1
    mtp_layers: int = 0
    mtp_block_ratio: float = 1.0
    platform_roles: tuple[LayerRole, ...] | None = field(default=None, compare=False)
    part: Part = "all"
    first_layer: int = 0

    def main(self) -> CacheLayout:
        """The main model's layers alone, what the runner allocates: this layout without its MTP layers
        (itself where it has none). Its cache is complete, and the rank's slot set, once :meth:`draft` is too."""
        self._check_whole("main")
        if not self.mtp_layers:
            return self
        return replace(self, num_layers=self.num_layers - self.mtp_layers, mtp_layers=0, part="main")

    def draft(self) -> CacheLayout:
        """The MTP draft layers alone, what FastDeploy's proposer allocates (``fastdeploy/spec_decode/mtp.py``
        ``MTPProposer.initialize_kv_cache``): layers numbered after the main model's, each holding
        ``int(num_blocks * mtp_block_ratio)`` blocks for the plan's ``num_blocks``."""
        self._check_whole("draft")
        if not self.mtp_layers:
            raise ConfigError(
                "use_mtp",
                False,
                "a layout with MTP layers for its draft part (use_mtp and num_nextn_predict_layers)",
                "build the layout from a model config with use_mtp=True",
            )
        return replace(self, num_layers=self.mtp_layers, part="draft", first_layer=self.num_layers - self.mtp_layers)

    def joined(self, draft: object) -> CacheLayout:
        """The whole layout again from this main part and its ``draft`` part (what one host swap cache holds,
        as FastDeploy's transfer manager carves one for ``num_layers + num_extra_layers``); a ConfigError
        unless ``draft`` is the draft part of the same rank's layout."""
        whole = None
        if self.part == "main" and isinstance(draft, CacheLayout) and draft.part == "draft":
            layers = self.num_layers + draft.num_layers
            whole = replace(self, num_layers=layers, mtp_layers=draft.num_layers, part="all")
        if whole is None or whole.draft() != draft:
            found = draft.describe() if isinstance(draft, CacheLayout) else draft
            raise ConfigError(
                "draft",
                found,
                f"the draft part of the same rank's layout as this one ({self.describe()})",
                "pass whole.main() as the layout and whole.draft() as draft, both of the rank's build_layout",
            )
        return whole

    def describe(self) -> str:
        """Which layers of which rank this layout holds, for a message."""
        last = self.first_layer + self.num_layers - 1
        ratio = f"ratio {self.mtp_block_ratio:g}"
        return f"the {self.part} part of rank {self.rank}: layers {self.first_layer}-{last}, {ratio}"

    def _check_whole(self, wanted: str) -> None:
        if self.part != "all":
            raise ConfigError(
                "layout.part",
                self.part,
                f"all: only a whole layout has a {wanted} part",
                f"take .{wanted}() of the rank's whole layout (build_layout)",
            )

    @property
    def allocated_roles(self) -> tuple[LayerRole, ...]:
        """One layer's tensors as they are allocated: the platform's shapes once shaped, else the core's."""
        return self.roles if self.platform_roles is None else self.platform_roles

    def default_shapes(self, num_blocks: int) -> tuple[CacheRoleShape, ...]:
        """One layer's tensors in the core's shapes for ``num_blocks`` blocks."""
        return tuple(CacheRoleShape(role.role, (num_blocks, *role.block_shape), role.dtype) for role in self.roles)

    def shaped(self, shapes: tuple[CacheRoleShape, ...]) -> CacheLayout:
        """This layout with a platform's shapes (checked by the caller: same roles, same bytes)."""
        roles = tuple(LayerRole(shape.role, shape.shape[1:], shape.dtype) for shape in shapes)
        return replace(self, platform_roles=None if roles == self.roles else roles)

    def on_device_type(self, device_type: str) -> CacheLayout:
        """This layout as a platform of Paddle device type ``device_type`` stores it: the core's own
        platform facts (``int4_zp``'s packing of key and value heads,
        :data:`~fd_platforms.rules.config.vocabulary.INT4_ZP_STORAGE`; a ``block_wise_fp8`` cache without
        scales, :data:`~fd_platforms.rules.config.vocabulary.BLOCK_WISE_FP8_WITHOUT_SCALES`) applied, which may
        change the bytes; ``self`` where none applies."""
        roles = self.roles
        if self.quant_type == "int4_zp" and self.attention in ("mha", "gqa"):  # MLA's latent is never packed
            roles = int4_zp_roles(self.kv_heads, self.block_size, self.head_dim, device_type)
        elif self.quant_type == "block_wise_fp8" and device_type in BLOCK_WISE_FP8_WITHOUT_SCALES:
            roles = tuple(role for role in roles if role.role not in ("key_scale", "value_scale"))
        return self if roles == self.roles else replace(self, roles=roles, platform_roles=None)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across every tensor of every layer: the one per-rank figure."""
        return self.num_layers * self.layer_bytes_per_block

    @property
    def layer_bytes_per_block(self) -> int:
        """Bytes of one block of one layer's tensors."""
        return sum(role.bytes_per_block for role in self.roles)

    def mtp_blocks(self, num_blocks: int) -> int:
        """Blocks an MTP layer's tensors hold on the device when the rank has ``num_blocks``."""
        return expanded_blocks(num_blocks, self.mtp_block_ratio)

    def check_mtp_blocks(self, num_blocks: int) -> int:
        """:meth:`mtp_blocks`, refused where the layout has MTP layers and a ratio below 1 rounds ``num_blocks`` to
        none (a ConfigError naming ``num_gpu_block_expand_ratio``): every path to a draft's tensors checks it."""
        blocks = self.mtp_blocks(num_blocks)
        if self.mtp_layers and blocks < 1:
            raise ConfigError(
                "num_gpu_block_expand_ratio",
                self.mtp_block_ratio,
                f"a ratio giving the MTP layers at least one block: int({num_blocks} x {self.mtp_block_ratio:g}) is 0",
                "raise num_gpu_block_expand_ratio (FastDeploy's default is 1.0) or plan more blocks",
            )
        return blocks

    def reported_mtp_blocks(self, num_blocks: int) -> int | None:
        """:meth:`mtp_blocks` for a report: None where the layout has no MTP layer."""
        return self.mtp_blocks(num_blocks) if self.mtp_layers else None

    def device_bytes(self, num_blocks: int) -> int:
        """Bytes of every device tensor when the rank has ``num_blocks`` blocks (MTP layers' included)."""
        main = self.num_layers - self.mtp_layers
        return self.layer_bytes_per_block * (main * num_blocks + self.mtp_layers * self.mtp_blocks(num_blocks))

    def blocks_within(self, nbytes: int) -> int:
        """The most blocks whose device tensors fit in ``nbytes`` (0 when not one does): the floor of
        ``nbytes / bytes_per_block`` without MTP, and the exact floor of the MTP sum with it."""
        if self.mtp_layers == 0 or self.mtp_block_ratio == 1:
            return max(nbytes, 0) // self.bytes_per_block
        return largest(lambda n: self.device_bytes(n) <= nbytes, max(nbytes, 0) // self.layer_bytes_per_block)

    def largest_tensor_elements(self, num_blocks: int) -> int:
        """Elements of the largest single device tensor when the rank has ``num_blocks`` blocks."""
        main = num_blocks if self.num_layers > self.mtp_layers else 0  # a draft part has no main layer
        mtp = self.mtp_blocks(num_blocks) if self.mtp_layers else 0
        return max(main, mtp) * self.max_elements_per_block

    @property
    def max_elements_per_block(self) -> int:
        """Elements per block of the largest single tensor (what element-count limits apply to)."""
        return max(role.elements_per_block for role in self.allocated_roles)

    @cached_property
    def tensors(self) -> tuple[CacheTensorSpec, ...]:
        """Every tensor of every layer, in contract order (built on first use)."""
        return tuple(
            CacheTensorSpec(
                name=f"{NAME_PREFIX[role.role]}_{layer}_rank{self.rank}.device{self.device_id}",
                layer=layer,
                role=role.role,
                block_shape=role.block_shape,
                dtype=role.dtype,
                block_ratio=self.mtp_block_ratio if layer >= end - self.mtp_layers else 1.0,
            )
            for end in (self.first_layer + self.num_layers,)
            for layer in range(self.first_layer, end)
            for role in self.allocated_roles
        )

    def names(self) -> tuple[str, ...]:
        """Tensor names in contract order."""
        return tuple(spec.name for spec in self.tensors)

    def host_names(self) -> tuple[str, ...]:
        """Names of the host swap tensors, in contract order: ``key_caches_{layer}_rank{rank}``, ... (no device)."""
        return tuple(f"{NAME_PREFIX[spec.role]}_{spec.layer}_rank{self.rank}" for spec in self.tensors)


def _layer_roles(model: ModelConfig, cache: CacheConfig, parallel: ParallelConfig) -> tuple[LayerRole, ...]:
    """One layer's tensors, in role order."""
    block = cache.block_size
    if model.attention == "dsa":  # FastDeploy's runner sets its own "uint8" quantization for DSA
        lora, rope, index = model.kv_lora_rank, model.qk_rope_head_dim, model.index_head_dim
        assert lora is not None and rope is not None and index is not None  # ModelConfig checked
        return (
            LayerRole("key", (1, block, lora + lora // 128 * 4 + 2 * rope), "uint8"),
            LayerRole("indexer", (block, index + index // 128 * 4), "uint8"),
        )
    dtype = cache_tensor_dtype(cache)
    scales = cache.kv_cache_quant_type == "block_wise_fp8"
    if model.attention == "mla":  # int4_zp too: FastDeploy's MLA backend ignores the quantization (full width)
        lora, rope = model.kv_lora_rank, model.qk_rope_head_dim
        assert lora is not None and rope is not None  # ModelConfig checked
        key = (LayerRole("key", (1, block, lora + rope), "uint8" if cache.kv_cache_quant_type == "int4_zp" else dtype),)
        return key + ((LayerRole("key_scale", (1, block), model.dtype),) if scales else ())
    heads = max(1, model.num_key_value_heads // parallel.tensor_parallel_size)
    if cache.kv_cache_quant_type == "int4_zp":
        if model.head_dim % 2:
            raise ConfigError(
                "head_dim",
                model.head_dim,
                "an even number for kv_cache_quant_type int4_zp (two values a byte)",
                "use a model with an even head_dim or another kv_cache_quant_type",
            )
        return int4_zp_roles(heads, block, model.head_dim, None)
    kv = (heads, block, model.head_dim)
    roles: tuple[LayerRole, ...] = (LayerRole("key", kv, dtype), LayerRole("value", kv, dtype))
    if scales:
        scale = (heads, block)
        roles += (LayerRole("key_scale", scale, model.dtype), LayerRole("value_scale", scale, model.dtype))
    return roles


def int4_zp_roles(heads: int, block: int, head_dim: int, device_type: str | None) -> tuple[LayerRole, ...]:
    """Key and value of an ``int4_zp`` cache as a platform of ``device_type`` stores them (the core's table,
    :data:`~fd_platforms.rules.config.vocabulary.INT4_ZP_STORAGE`; None: packed, two values a byte)."""
    per_byte, dtype = int4_zp_storage(device_type)
    shape = (heads, block, head_dim // per_byte)
    return (LayerRole("key", shape, dtype), LayerRole("value", shape, dtype))


def expanded_blocks(num_blocks: int, ratio: float) -> int:
    """``int(num_blocks * ratio)``, FastDeploy's MTP block count (exactly ``num_blocks`` at ratio 1)."""
    return num_blocks if ratio == 1 else int(num_blocks * ratio)


def largest(holds: Callable[[int], bool], upper: int) -> int:
    """The largest ``n`` in ``0..upper`` for which ``holds(n)``, for a ``holds`` that stays true below
    any ``n`` it holds for (0 when it holds for none above 0)."""
    return bisect.bisect_left(range(1, upper + 1), True, key=lambda n: not holds(n))  # the count of n >= 1 it holds for


def check_layout(layout: object) -> CacheLayout:
    """``layout`` if it is a :class:`CacheLayout`, else a ConfigError naming ``layout``."""
    if not isinstance(layout, CacheLayout):
        raise ConfigError(
            "layout", layout, "a CacheLayout", "build the rank's layout with fd_platforms.rules.layout.build_layout"
        )
    return layout


def check_num_blocks(num_blocks: object) -> int:
    """``num_blocks`` if it is an integer from 1 to ``MAX_COUNT`` (ConfigError otherwise)."""
    return check_int("num_blocks", num_blocks, 1, fix="plan the blocks first (max_num_blocks)")


def cache_tensor_dtype(cache: CacheConfig) -> str:
    """The dtype key and value tensors are allocated in: the cache dtype, or ``uint8`` for an 8-bit
    cache (FastDeploy allocates fp8 and int8 caches as ``uint8``; kernels view them as they need)."""
    return "uint8" if cache.cache_dtype in EIGHT_BIT_DTYPES else cast(str, cache.cache_dtype)  # resolved: never None


def build_layout(
    model: ModelConfig,
    cache: CacheConfig,
    parallel: ParallelConfig,
    *,
    device_id: int = 0,
    local_device: int | None = None,
) -> CacheLayout:
    """The cache tensors rank ``parallel.local_rank`` holds: named for device ``device_id`` (the physical
    id, :func:`~fd_platforms.rules.devices.physical_device_id`), allocated on local device ``local_device``
    (None: ``device_id``, the same where the visible devices start at 0).

    Raises ConfigError for a tensor-parallel size that does not split the model's heads.
    """
    check_int("device_id", device_id, 0, INT32_MAX, fix="pass the device id that names the rank's tensors")
    if local_device is None:
        local_device = device_id
    check_int("local_device", local_device, 0, INT32_MAX, fix="pass the local device index the tensors live on")
    check_tensor_parallel(model, parallel.tensor_parallel_size)
    roles = _layer_roles(model, cache, parallel)
    latent = model.attention in ("mla", "dsa")  # one latent "head"; otherwise the core's key is heads-first
    assert model.attention is not None and cache.cache_dtype is not None  # both resolved by __post_init__
    return CacheLayout(
        roles=roles,
        num_layers=model.num_cache_layers,
        block_size=cache.block_size,
        rank=parallel.local_rank,
        device_id=device_id,
        local_device=local_device,
        attention=model.attention,
        quant_type="none" if model.attention == "dsa" else cache.kv_cache_quant_type,
        cache_dtype=cache.cache_dtype,
        kv_heads=1 if latent else roles[0].block_shape[0],
        head_dim=roles[0].block_shape[-1] if latent else model.head_dim,
        mtp_layers=model.num_nextn_predict_layers if model.use_mtp else 0,
        mtp_block_ratio=cache.num_gpu_block_expand_ratio,
    )


def build_draft_layout(
    model: ModelConfig,
    cache: CacheConfig,
    parallel: ParallelConfig,
    *,
    device_id: int = 0,
    local_device: int | None = None,
) -> CacheLayout:
    """The MTP draft layers rank ``parallel.local_rank`` holds, as FastDeploy's proposer allocates them
    (``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``): the :meth:`~CacheLayout.draft`
    part of the rank's whole layout with MTP (``model``'s ``use_mtp`` taken as set); the device ids as
    :func:`build_layout`'s. A ConfigError for a model without ``num_nextn_predict_layers``."""
    whole = build_layout(replace(model, use_mtp=True), cache, parallel, device_id=device_id, local_device=local_device)
    return whole.draft()
