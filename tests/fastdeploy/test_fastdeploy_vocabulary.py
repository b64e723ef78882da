"""FastDeploy's ``kv_cache_quant_type`` and ``cache_dtype`` words, accepted as they are (one table).

Each value is FastDeploy's (``quantization/kv_cache.py`` ``KvCacheQuantzationTypes``, ``config.py``
``CacheConfig.__init__``, ``cache_transfer_manager.py`` ``parse_args``); see
:mod:`fd_platforms.rules.config.vocabulary` for where each row comes from.
"""

from __future__ import annotations

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig
from fd_platforms.rules.config.limits import CACHE_DTYPES, QUANT_TYPES
from fd_platforms.rules.config.vocabulary import (
    CACHE_DTYPE_WORDS,
    FASTDEPLOY_WORDS,
    QUANT_WORDS,
    cache_settings_from_fastdeploy,
)
from fd_platforms.rules.layout import build_layout

GQA = ModelConfig("gqa", 2, 32, 8, 128)


@pytest.mark.parametrize(
    ("word", "dtype", "quant"),
    [
        ("none", "bfloat16", "none"),
        ("int8", "int8", "none"),
        ("int8_zp", "int8", "none"),
        ("float8_e4m3fn", "float8_e4m3fn", "none"),
        ("float8_e4m3fn_zp", "float8_e4m3fn", "none"),
        ("float8_e4m3", "float8_e4m3fn", "none"),  # kv_cache.py KvCacheQuantzationTypes.FP8_E4M3
        ("block_wise_fp8", "float8_e4m3fn", "block_wise_fp8"),
        ("int4_zp", "bfloat16", "int4_zp"),
    ],
)
def test_every_fastdeploy_kv_cache_quant_type_is_accepted_as_it_is(word: str, dtype: str, quant: str) -> None:
    cache = CacheConfig(kv_cache_quant_type=word)
    assert (cache.cache_dtype, cache.kv_cache_quant_type) == (dtype, quant)
    assert build_layout(GQA, cache, ParallelConfig()).bytes_per_block > 0


@pytest.mark.parametrize(
    ("word", "dtype", "quant", "tensor_dtype"),
    [
        ("bfloat16", "bfloat16", "none", "bfloat16"),
        ("float16", "float16", "none", "float16"),
        ("float32", "float32", "none", "float32"),
        ("uint8", "uint8", "none", "uint8"),
        ("float8_e4m3", "float8_e4m3fn", "none", "uint8"),
        ("block_wise_fp8", "float8_e4m3fn", "block_wise_fp8", "uint8"),
        ("int8", "int8", "none", "uint8"),
        ("int4_zp", "bfloat16", "int4_zp", "uint8"),
    ],
)
def test_every_fastdeploy_cache_dtype_is_accepted_as_it_is(
    word: str, dtype: str, quant: str, tensor_dtype: str
) -> None:
    cache = CacheConfig(cache_dtype=word)
    assert (cache.cache_dtype, cache.kv_cache_quant_type) == (dtype, quant)
    key = build_layout(GQA, cache, ParallelConfig()).tensors[0]
    assert key.dtype == tensor_dtype


def test_a_float32_cache_is_four_bytes_a_value_as_fastdeploys_runner_allocates_the_model_dtype() -> None:
    layout = build_layout(GQA, CacheConfig(cache_dtype="float32"), ParallelConfig())
    assert layout.bytes_per_block == 4 * 2 * 8 * 64 * 128 * 2


@pytest.mark.parametrize(
    ("quant", "dtype", "expected"),
    [
        (None, "bfloat16", ("bfloat16", "none")),
        (None, "float16", ("float16", "none")),
        (None, "uint8", ("uint8", "none")),
        ("int8", "uint8", ("int8", "none")),
        ("float8_e4m3fn", "uint8", ("float8_e4m3fn", "none")),
        ("block_wise_fp8", "uint8", ("float8_e4m3fn", "block_wise_fp8")),
        (None, "block_wise_fp8", ("float8_e4m3fn", "block_wise_fp8")),  # the transfer manager's --cache_dtype
        ("int4_zp", "uint8", ("uint8", "int4_zp")),
        ("float8_e4m3", "uint8", ("float8_e4m3fn", "none")),  # CacheConfig turned it into uint8
        ("float8_e4m3", "bfloat16", ("float8_e4m3fn", "none")),  # the runner's model dtype: uint8 all the same
        ("int8_zp", "bfloat16", ("int8", "none")),  # the runner allocates uint8 whenever a quantization is set
    ],
)
def test_cache_settings_from_fastdeploy_maps_the_raw_strings(
    quant: str | None, dtype: str, expected: tuple[str, str]
) -> None:
    settings = cache_settings_from_fastdeploy(kv_cache_quant_type=quant, cache_dtype=dtype)
    assert (settings["cache_dtype"], settings["kv_cache_quant_type"]) == expected
    assert CacheConfig(**settings).cache_dtype == expected[0]


@pytest.mark.parametrize(("field", "words"), [("kv_cache_quant_type", QUANT_WORDS), ("cache_dtype", CACHE_DTYPE_WORDS)])
def test_an_unknown_fastdeploy_word_is_a_config_error_listing_every_accepted_value(
    field: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        cache_settings_from_fastdeploy(**{"kv_cache_quant_type": None, "cache_dtype": None, field: "fp4"})
    assert info.value.field == field and info.value.value == "fp4"
    assert all(word in info.value.allowed for word in words) and "Fix:" in str(info.value)


def test_two_different_quantizations_are_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        cache_settings_from_fastdeploy(kv_cache_quant_type="int4_zp", cache_dtype="block_wise_fp8")
    assert info.value.field == "cache_dtype" and "Fix:" in str(info.value)


def test_every_row_of_the_table_maps_to_our_values() -> None:
    assert set(CACHE_DTYPE_WORDS) | set(QUANT_WORDS) == set(FASTDEPLOY_WORDS)
    for word, row in FASTDEPLOY_WORDS.items():
        assert row.quant_type in QUANT_TYPES, word
        assert row.cache_dtype is None or row.cache_dtype in CACHE_DTYPES, word
        assert row.source, word


FP8_E4M3 = "float8_e4m3"
"""FastDeploy's ``KvCacheQuantzationTypes.FP8_E4M3`` (``model_executor/layers/quantization/kv_cache.py``): its
runner allocates it as ``uint8`` (``gpu_model_runner.py`` ``initialize_kv_cache``, any kv_cache_quant_type), its
``CacheConfig.__init__`` turns it into the cache dtype ``uint8`` (the name holds ``float8``)."""


def test_float8_e4m3_is_a_quantization_word_everywhere_fastdeploy_takes_one(tmp_path) -> None:
    """As kv_cache_quant_type of our record, of the deploy TOML, of the CLI's --kv-cache-quant-type, and as the
    quantization FastDeploy's raw strings hold: an 8-bit cache a byte a value, as float8_e4m3fn's."""
    from fd_platforms.rules.config import load_deploy_config

    fn = build_layout(GQA, CacheConfig(kv_cache_quant_type="float8_e4m3fn"), ParallelConfig())
    cache = CacheConfig(kv_cache_quant_type=FP8_E4M3)
    layout = build_layout(GQA, cache, ParallelConfig())
    assert (cache.cache_dtype, cache.kv_cache_quant_type) == ("float8_e4m3fn", "none")
    assert layout.bytes_per_block == fn.bytes_per_block and layout.tensors[0].dtype == "uint8"
    assert FP8_E4M3 in QUANT_WORDS and FP8_E4M3 in CACHE_DTYPE_WORDS
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8}')
    (tmp_path / "deploy.toml").write_text(f'[model]\npath = "m"\n[cache]\nkv_cache_quant_type = "{FP8_E4M3}"\n')
    assert load_deploy_config(tmp_path / "deploy.toml").cache == cache
    assert cache_settings_from_fastdeploy(kv_cache_quant_type=FP8_E4M3.upper(), cache_dtype="bfloat16") == {
        "cache_dtype": "float8_e4m3fn",
        "kv_cache_quant_type": "none",
    }


def test_the_plan_command_takes_float8_e4m3_as_float8_e4m3fn_bytes() -> None:
    import json

    from run_helpers import QWEN, main_in_process

    plans = []
    for word in (FP8_E4M3, "float8_e4m3fn"):
        done = main_in_process(
            "plan",
            "--platform",
            "cpu",
            "--model",
            QWEN,
            "--device-memory",
            "8GiB",
            "--kv-cache-quant-type",
            word,
            "--json",
        )
        assert done.returncode == 0, done.stderr
        plans.append(json.loads(done.stdout))
    assert plans[0] == plans[1] and plans[0]["tensor_dtypes"] == {"key": "uint8", "value": "uint8"}
