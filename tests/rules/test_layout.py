"""The KV cache layout contract: per-variant shapes and bytes (hand-computed), order, names."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import fd_platforms.rules.layout as layout_module
from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import DTYPE_BYTES, ROLE_ORDER, CacheLayout, LayerRole, build_layout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QWEN = load_model_config(EXAMPLES / "qwen3-30b-a3b")
LLAMA = load_model_config(EXAMPLES / "llama-3.1-8b")
DEEPSEEK_V3 = load_model_config(EXAMPLES / "deepseek-v3")
DEEPSEEK_V32 = load_model_config(EXAMPLES / "deepseek-v3.2")
BF16 = CacheConfig(block_size=64, cache_dtype="bfloat16")
TP1, TP4 = ParallelConfig(1, 0), ParallelConfig(4, 0)


def assert_contract_order(layout: CacheLayout) -> None:
    """Layer-major, then key, value, key_scale, value_scale, indexer."""
    keys = [(spec.layer, ROLE_ORDER.index(spec.role)) for spec in layout.tensors]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert {spec.layer for spec in layout.tensors} == set(range(layout.num_layers))


def test_qwen3_tp4_bf16() -> None:
    layout = build_layout(QWEN, BF16, TP4)
    # bf16 2 bytes * (key + value) * block 64 * head_dim 128 * (4 kv heads // tp 4) * 48 layers
    assert layout.bytes_per_block == 2 * 2 * 64 * 128 * 1 * 48
    assert layout.num_layers == 48 and layout.block_size == 64
    assert len(layout.tensors) == 2 * 48
    assert {spec.block_shape for spec in layout.tensors} == {(1, 64, 128)}
    assert {spec.dtype for spec in layout.tensors} == {"bfloat16"}
    assert layout.max_elements_per_block == 1 * 64 * 128
    assert_contract_order(layout)


def test_llama_tp_splits_kv_heads() -> None:
    assert build_layout(LLAMA, BF16, TP1).bytes_per_block == 2 * 2 * 64 * 128 * 8 * 32
    assert build_layout(LLAMA, BF16, TP4).bytes_per_block == 2 * 2 * 64 * 128 * 2 * 32
    assert build_layout(LLAMA, BF16, ParallelConfig(8, 0)).bytes_per_block == 2 * 2 * 64 * 128 * 1 * 32


def test_kv_heads_per_rank_floor_is_one() -> None:
    layout = build_layout(LLAMA, BF16, ParallelConfig(16, 15))  # 8 kv heads // 16 ranks = 0 -> 1
    assert layout.tensors[0].block_shape == (1, 64, 128)
    assert layout.bytes_per_block == 2 * 2 * 64 * 128 * 1 * 32


def test_mha() -> None:
    mha = ModelConfig("mha", num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12, head_dim=64)
    assert mha.attention == "mha"
    layout = build_layout(mha, CacheConfig(block_size=16, cache_dtype="float16"), ParallelConfig(2, 1))
    assert layout.bytes_per_block == 2 * 2 * 16 * 64 * 6 * 12
    assert layout.tensors[0].block_shape == (6, 16, 64)


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_8bit_cache_halves_bytes(dtype: str) -> None:
    layout = build_layout(QWEN, CacheConfig(cache_dtype=dtype), TP4)
    assert layout.bytes_per_block == 1 * 2 * 64 * 128 * 1 * 48


def test_block_wise_fp8_scales() -> None:
    cache = CacheConfig(cache_dtype="fp8", kv_cache_quant_type="block_wise_fp8")
    layout = build_layout(LLAMA, cache, TP4)
    # per layer: 8-bit key + value (2 heads/rank), allocated as uint8 as FastDeploy does, and key and
    # value scales per head per token in the model's dtype (FastDeploy's default dtype: bf16, 2 bytes)
    assert layout.bytes_per_block == (1 * 2 * 64 * 128 * 2 + 2 * 2 * 2 * 64) * 32
    first_layer = layout.tensors[:4]
    assert [spec.role for spec in first_layer] == ["key", "value", "key_scale", "value_scale"]
    assert [spec.dtype for spec in first_layer] == ["uint8", "uint8", "bfloat16", "bfloat16"]
    assert first_layer[2].block_shape == (2, 64)
    half = build_layout(replace(LLAMA, dtype="float16"), cache, TP4)
    assert {spec.dtype for spec in half.tensors if spec.role.endswith("scale")} == {"float16"}
    assert layout.names()[:4] == (
        "key_caches_0_rank0.device0",
        "value_caches_0_rank0.device0",
        "key_cache_scales_0_rank0.device0",
        "value_cache_scales_0_rank0.device0",
    )
    assert_contract_order(layout)


def test_deepseek_v3_mla() -> None:
    layout = build_layout(DEEPSEEK_V3, BF16, TP4)
    assert (DEEPSEEK_V3.kv_lora_rank or 0) + (DEEPSEEK_V3.qk_rope_head_dim or 0) == 576  # values per token per layer
    assert layout.bytes_per_block == 2 * 576 * 64 * 61
    assert [spec.role for spec in layout.tensors] == ["key"] * 61
    assert layout.tensors[0].block_shape == (1, 64, 576)
    assert build_layout(DEEPSEEK_V3, BF16, TP1).bytes_per_block == layout.bytes_per_block  # not split by tp
    assert build_layout(DEEPSEEK_V3, CacheConfig(cache_dtype="fp8"), TP4).bytes_per_block == 1 * 576 * 64 * 61


def test_deepseek_v3_mtp_adds_a_layer() -> None:
    mtp = load_model_config(EXAMPLES / "deepseek-v3", use_mtp=True)
    layout = build_layout(mtp, BF16, TP4)
    assert layout.num_layers == 62
    assert layout.bytes_per_block == 2 * 576 * 64 * (61 + 1)
    assert layout.names()[-1] == "key_caches_61_rank0.device0"


def test_mla_with_mtp_has_no_value_placeholder_in_the_layout() -> None:
    """FastDeploy's MTP proposer makes a ``value_caches_{L}_rank…`` tensor of shape [] per draft layer
    for MLA; it holds no block and is never shared, so the layout (what is created, published and
    attached by name) leaves it out and documents that a proposer makes its own."""
    layout = build_layout(load_model_config(EXAMPLES / "deepseek-v3", use_mtp=True), BF16, TP4)
    assert not [name for name in layout.names() if name.startswith("value_caches_")]
    assert all(spec.shape(1)[0] == 1 for spec in layout.tensors), "every tensor holds blocks"
    assert "value_caches_{layer}_rank" in layout_module.__doc__ and "shape ``[]``" in layout_module.__doc__


def test_deepseek_v32_dsa() -> None:
    layout = build_layout(DEEPSEEK_V32, BF16, TP4)
    key = 512 + 512 // 128 * 4 + 2 * 64  # 656
    indexer = 128 + 128 // 128 * 4  # 132
    assert layout.bytes_per_block == (key + indexer) * 64 * 61
    assert layout.bytes_per_block == (512 + 512 // 128 * 4 + 2 * 64 + 128 + 128 // 128 * 4) * 64 * 61
    assert [spec.role for spec in layout.tensors[:2]] == ["key", "indexer"]
    assert layout.tensors[0].block_shape == (1, 64, 656) and layout.tensors[1].block_shape == (64, 132)
    assert layout.tensors[1].shape(9) == (9, 64, 132), "3-D, as FastDeploy's DSA backend shapes the indexer"
    assert {spec.dtype for spec in layout.tensors} == {"uint8"}
    assert layout.max_elements_per_block == 656 * 64
    assert layout.names()[:2] == ("key_caches_0_rank0.device0", "indexer_caches_0_rank0.device0")
    assert_contract_order(layout)
    # uint8 whatever the cache dtype; MTP adds a layer
    assert build_layout(DEEPSEEK_V32, CacheConfig(cache_dtype="fp8"), TP4).bytes_per_block == layout.bytes_per_block
    mtp = load_model_config(EXAMPLES / "deepseek-v3.2", use_mtp=True)
    assert build_layout(mtp, BF16, TP4).bytes_per_block == (656 + 132) * 64 * 62


def test_names_carry_rank_and_device() -> None:
    layout = build_layout(QWEN, BF16, ParallelConfig(4, 3), device_id=5)
    assert layout.names()[:4] == (
        "key_caches_0_rank3.device5",
        "value_caches_0_rank3.device5",
        "key_caches_1_rank3.device5",
        "value_caches_1_rank3.device5",
    )
    assert layout.names()[-1] == "value_caches_47_rank3.device5"
    assert len(set(layout.names())) == len(layout.names())


def test_spec_shape_and_bytes() -> None:
    spec = build_layout(LLAMA, BF16, TP4).tensors[0]
    assert spec.shape(1000) == (1000, 2, 64, 128)
    assert spec.elements_per_block == 2 * 64 * 128
    assert spec.bytes_per_block == 2 * 2 * 64 * 128


def test_mla_with_block_wise_fp8_has_the_key_and_its_scales_as_fastdeploy_allocates() -> None:
    """FastDeploy runs MLA with block_wise_fp8 (``gpu_model_runner.py`` ``initialize_kv_cache``): the
    key ``uint8`` as the MLA backend's ``get_kv_cache_shape`` states it, then its scales, the key's
    first three axes ``[N, 1, block]`` in Paddle's default dtype; no value tensor."""
    layout = build_layout(DEEPSEEK_V3, CacheConfig(kv_cache_quant_type="block_wise_fp8"), TP4)
    assert [spec.role for spec in layout.tensors[:3]] == ["key", "key_scale", "key"]
    key, scale = layout.tensors[:2]
    assert (key.shape(5), key.dtype) == ((5, 1, 64, 576), "uint8")
    assert (scale.shape(5), scale.dtype) == ((5, 1, 64), "bfloat16")
    assert scale.name == "key_cache_scales_0_rank0.device0"
    assert layout.bytes_per_block == (576 + 2) * 64 * 61
    assert_contract_order(layout)


def test_dsa_with_block_wise_fp8_builds_the_packed_cache_fastdeploy_builds() -> None:
    """FastDeploy's runner sets its own ``uint8`` quantization for DSA (``gpu_model_runner.py``
    ``initialize_kv_cache``), so a configured block_wise_fp8 adds no scale tensor."""
    cache = CacheConfig(cache_dtype="fp8", kv_cache_quant_type="block_wise_fp8")
    layout = build_layout(DEEPSEEK_V32, cache, TP4)
    assert layout.tensors == build_layout(DEEPSEEK_V32, BF16, TP4).tensors
    assert layout.quant_type == "none"


def test_int4_zp_on_mla_is_the_full_latent_in_uint8_as_fastdeploys_runner_allocates_it() -> None:
    """``mla_attention_backend.py`` ``get_kv_cache_shape`` ignores the quantization; ``gpu_model_runner.py``
    ``initialize_kv_cache`` allocates ``uint8`` whenever one is set."""
    layout = build_layout(DEEPSEEK_V3, CacheConfig(kv_cache_quant_type="int4_zp"), TP4)
    assert layout.quant_type == "int4_zp" and layout.roles == (LayerRole("key", (1, 64, 512 + 64), "uint8"),)
    assert layout.on_device_type("xpu") is layout  # never packed, on any platform


@pytest.mark.parametrize("device_id", [-1, True, "0"])
def test_bad_device_id(device_id: object) -> None:
    with pytest.raises(ConfigError, match=r"device_id=.*allowed: an integer from 0 to 2\*\*31 - 1.*Fix:"):
        build_layout(QWEN, BF16, TP4, device_id=device_id)  # type: ignore[arg-type]


def test_dtype_bytes() -> None:
    assert DTYPE_BYTES == {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int8": 1, "uint8": 1, "float32": 4}


@given(
    kv_heads=st.sampled_from([1, 2, 4, 8, 16, 32]),
    group=st.sampled_from([1, 2, 4, 8]),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    head_dim=st.sampled_from([64, 96, 128, 256]),
    block=st.integers(min_value=1, max_value=256),
    layers=st.integers(min_value=1, max_value=96),
    dtype=st.sampled_from(["bfloat16", "float16", "int8", "fp8"]),
)
def test_gqa_bytes_property(
    kv_heads: int, group: int, tp: int, head_dim: int, block: int, layers: int, dtype: str
) -> None:
    assume(kv_heads * group % tp == 0)  # a split that does not divide the heads is refused (tested below)
    gqa = ModelConfig("p", layers, kv_heads * group, kv_heads, head_dim)
    cache = CacheConfig(block_size=block, cache_dtype=dtype)
    layout = build_layout(gqa, cache, ParallelConfig(tp, tp - 1))
    per_rank = max(1, kv_heads // tp)
    dtype_bytes = 2 if dtype in ("bfloat16", "float16") else 1
    assert layout.bytes_per_block == dtype_bytes * 2 * block * head_dim * per_rank * layers
    assert layout.bytes_per_block == sum(spec.bytes_per_block for spec in layout.tensors)
    assert layout.max_elements_per_block == per_rank * block * head_dim
    assert_contract_order(layout)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "why", "works"),
    [
        (32, 4, 3, "num_attention_heads=32 is not divisible by 3", "1, 2, 4, 8, 16, 32"),
        (32, 32, 64, "num_attention_heads=32 is not divisible by 64", "1, 2, 4, 8, 16, 32"),
        (24, 6, 4, "num_key_value_heads=6 neither is divisible by 4 nor divides it", "1, 2, 3, 6, 12, 24"),
    ],
)
def test_a_tensor_parallel_size_that_does_not_split_the_heads_is_refused(
    heads: int, kv_heads: int, tp: int, why: str, works: str
) -> None:
    model = ModelConfig("m", 2, heads, kv_heads, 64)
    with pytest.raises(ConfigError) as info:
        build_layout(model, BF16, ParallelConfig(tp, 0))
    message = str(info.value)
    assert f"tensor_parallel_size={tp} is not valid" in message and why in message
    assert f"for m: {works}. Fix: choose one of those" in message


def test_kv_heads_fewer_than_ranks_are_replicated() -> None:
    """tp 8 with 4 KV heads: each KV head lives on two ranks, one head per rank (vLLM's rule)."""
    layout = build_layout(ModelConfig("m", 2, 32, 4, 128), BF16, ParallelConfig(8, 7))
    assert layout.roles[0].block_shape == (1, 64, 128)


def test_an_absurd_layer_count_is_refused_at_once_and_planning_builds_no_tensor_list() -> None:
    started = time.monotonic()
    with pytest.raises(
        ConfigError,
        match=r"num_hidden_layers=1000000000000000000000000000000 is not valid; allowed: an integer from 1 to 10000",
    ):
        ModelConfig("m", 10**30, 32, 8, 128)
    assert time.monotonic() - started < 5, "refused before anything the size of the count is built"
    deep = build_layout(ModelConfig("m", 10_000, 32, 8, 128), BF16, ParallelConfig(1, 0))
    assert deep.bytes_per_block == 10_000 * 2 * 2 * 64 * 128 * 8
    assert "tensors" not in vars(deep), "bytes per block needs no per-layer objects"
    assert len(deep.tensors) == 20_000 and deep.tensors[-1].name == "value_caches_9999_rank0.device0"
