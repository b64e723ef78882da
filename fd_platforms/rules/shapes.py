"""Platform-owned cache shapes: what a platform is asked, and the check of every answer.

The core owns the bytes; a platform owns the axes. :func:`shape_request` asks for one layer's
tensors of a layout (the core's shapes as the starting point); :func:`shape_violations` checks an
answer: the same roles in the same order, the block axis first, each role's bytes the core's.
:func:`shape_cases` is what a plugin's ``kv_cache_shapes`` is checked against when it is loaded:
every layer kind and quantization the layout knows. :func:`engine_shaped` holds an engine's own
tensor specs (what its attention backend's ``get_kv_cache_shape`` states) to the same check.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from ..contract.errors import ConfigError
from ..contract.types import CacheRoleShape, CacheShapeRequest
from .config.limits import CACHE_DTYPES, EIGHT_BIT_DTYPES, QUANT_TYPES
from .config.model import ModelConfig
from .config.settings import CacheConfig, ParallelConfig
from .layout import CacheLayout, build_layout

CASE_BLOCKS = 3
"""Blocks in the load-time cases (any count checks the same axes; a small one keeps them cheap)."""


def layer_blocks(layout: CacheLayout, num_blocks: int) -> int:
    """Blocks one layer's tensors of ``layout`` hold on the device when the rank has ``num_blocks``: the MTP draft
    part's ``int(num_blocks * num_gpu_block_expand_ratio)`` (every layer of it an MTP layer: what FastDeploy's proposer
    asks its backend for, ``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``), else ``num_blocks``
    (a whole layout's one layer is a main layer). A ratio that leaves the draft no block is refused, naming it."""
    return layout.check_mtp_blocks(num_blocks) if layout.part == "draft" else num_blocks


def shape_request(layout: CacheLayout, num_blocks: int) -> CacheShapeRequest:
    """What a platform is asked to shape one layer of ``layout``'s tensors for, the rank having ``num_blocks`` blocks:
    the blocks that layer holds (:func:`layer_blocks`)."""
    blocks = layer_blocks(layout, num_blocks)
    return CacheShapeRequest(
        attention=layout.attention,  # type: ignore[arg-type]  # build_layout resolved it
        quant_type=layout.quant_type,
        cache_dtype=layout.cache_dtype,
        num_blocks=blocks,
        block_size=layout.block_size,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        default=layout.default_shapes(blocks),
    )


def shape_violations(request: CacheShapeRequest, answer: object) -> list[str]:
    """Every way ``answer`` differs from what ``request`` allows (empty when it is good)."""
    kind = f"{request.attention} layer, quant {request.quant_type}, cache dtype {request.cache_dtype}"
    if not isinstance(answer, tuple) or not all(isinstance(role, CacheRoleShape) for role in answer):
        return [f"{kind}: answered {type(answer).__name__}, not a tuple of CacheRoleShape"]
    roles = [role.role for role in answer]
    expected = [role.role for role in request.default]
    if roles != expected:
        return [f"{kind}: roles {roles}, expected {expected} in that order"]
    found = []
    for got, core in zip(answer, request.default, strict=True):  # the same roles: checked above
        if got.shape[0] != request.num_blocks:
            found.append(
                f"{kind}: role {got.role} shape {list(got.shape)} does not start with the block axis "
                f"({request.num_blocks} blocks asked)"
            )
        elif got.nbytes != core.nbytes:
            found.append(
                f"{kind}: role {got.role} is {list(got.shape)} {got.dtype} = {got.nbytes} bytes for "
                f"{request.num_blocks} blocks; the core's {list(core.shape)} {core.dtype} is {core.nbytes} bytes"
            )
    return found


def engine_shaped(layout: CacheLayout, tensor_specs: object, num_blocks: int) -> CacheLayout:
    """``layout`` in the engine's own shapes: ``tensor_specs`` is one layer's tensors as the engine's
    attention backend states them for the blocks that layer holds when the rank has ``num_blocks``
    (:func:`layer_blocks`: an MTP draft part's ``int(num_blocks * ratio)``) (FastDeploy: ``get_kv_cache_shape`` in
    ``append_attn_backend.py``, ``backends/xpu/attention.py``, ``mla_attention_backend.py``, the scales
    the key's first three axes), in the order its kernels index the flat cache list. The core checks
    them instead of deriving them: the layout's roles in the contract order (key, value, key_scale,
    value_scale, indexer: FastDeploy's ``gpu_model_runner.py`` ``initialize_kv_cache`` order, and the
    ``caches[2 * layer]`` its XPU kernels index), each role once (so every tensor name is unique),
    the block axis first, and each role's bytes the planner's (so
    :attr:`CacheLayout.bytes_per_block <fd_platforms.rules.layout.CacheLayout.bytes_per_block>` holds). A ConfigError
    naming the spec, the value, what is allowed and the fix otherwise."""
    request = shape_request(layout, num_blocks)
    expected = ", ".join(f"{role.role} {list(role.shape)} {role.dtype}" for role in request.default)
    if not isinstance(tensor_specs, Sequence) or not all(isinstance(spec, CacheRoleShape) for spec in tensor_specs):
        raise ConfigError(
            "tensor_specs",
            tensor_specs,
            f"one layer's tensors as CacheRoleShape records, e.g. {expected}",
            "state each tensor as CacheRoleShape(role, (num_blocks, ...), dtype), in the order the kernels index",
        )
    specs = tuple(tensor_specs)
    violations = shape_violations(request, specs)
    if violations:
        stated = "; ".join(f"{spec.role} {list(spec.shape)} {spec.dtype}" for spec in specs)
        raise ConfigError(
            "tensor_specs",
            stated,
            f"the layout's roles in this order, blocks first, each with the planner's bytes: {expected} "
            "(any axes after the blocks and any dtype of the same bytes)",
            f"{violations[0]}; state what the attention backend gives for these {request.num_blocks} blocks"
            f"{_draft_note(layout, num_blocks)}, with the model, cache and parallel settings the plan used",
        )
    return layout.shaped(specs)


def _draft_note(layout: CacheLayout, num_blocks: int) -> str:
    """For a draft part's refusal: how its block count follows from the rank's."""
    if layout.part != "draft":
        return ""
    return f" (the draft layers hold int({num_blocks} * num_gpu_block_expand_ratio {layout.mtp_block_ratio:g}))"


@cache
def shape_cases() -> tuple[CacheShapeRequest, ...]:
    """One request per layer kind and quantization the layout knows (a GQA model with 8 key/value
    heads of 128, block 64; an MLA and a DSA model), in every cache dtype each allows."""
    gqa = ModelConfig("case-gqa", 2, 32, 8, 128)
    mla = ModelConfig("case-mla", 2, 16, 16, 192, kv_lora_rank=512, qk_rope_head_dim=64)
    dsa = ModelConfig("case-dsa", 2, 16, 16, 192, kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128)
    requests = []
    quants = {gqa: QUANT_TYPES, mla: QUANT_TYPES, dsa: ("none",)}
    for model in (gqa, mla, dsa):
        for quant in quants[model]:
            for dtype in EIGHT_BIT_DTYPES if quant == "block_wise_fp8" else CACHE_DTYPES:
                layout = build_layout(
                    model, CacheConfig(cache_dtype=dtype, kv_cache_quant_type=quant), ParallelConfig()
                )
                requests.append(shape_request(layout, CASE_BLOCKS))
    return tuple(requests)
