"""Config records, HF config.json loading and the deployment TOML: values, defaults, every error path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import (
    CacheConfig,
    DeployConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    deploy_config_from_overrides,
    load_deploy_config,
    load_model_config,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def check_error(error: ConfigError, field: str, value: object, source: str | Path | None = None) -> str:
    """The error names the field, the value, what is allowed and a fix, on one line; returns the message."""
    message = str(error)
    assert error.field == field, message
    assert error.value == value or (isinstance(value, float) and math.isnan(value)), message
    assert (f"{field} is not given" if value is None else f"{field}={value!r}") in message, message
    assert "allowed: " in message and error.allowed
    assert "Fix: " in message and error.fix
    assert "\n" not in message
    assert error.source == (None if source is None else str(source))
    if source is not None:
        assert message.startswith(f"{source}: ")
    return message


def model(**changes: object) -> ModelConfig:
    fields: dict[str, object] = {
        "name": "m",
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
    }
    fields.update(changes)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def write_model(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def write_toml(tmp_path: Path, text: str, model_dir: str = "m") -> Path:
    write_model(tmp_path / model_dir, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    file = tmp_path / "deploy.toml"
    file.write_text(text)
    return file


# CacheConfig ---------------------------------------------------------------------------------


def test_cache_defaults() -> None:
    cache = CacheConfig()
    assert (cache.block_size, cache.cache_dtype, cache.kv_cache_quant_type) == (64, "bfloat16", "none")
    assert (cache.memory_utilization, cache.num_cpu_blocks, cache.swap_space_bytes) == (0.9, 0, 0)
    assert cache.kvcache_storage_backend is None and cache.num_gpu_blocks_override is None


@pytest.mark.parametrize("alias", ["fp8", "FP8", "float8_e4m3fn"])
def test_cache_fp8_alias_is_normalised(alias: str) -> None:
    assert CacheConfig(cache_dtype=alias).cache_dtype == "float8_e4m3fn"


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_block_wise_fp8_with_8bit_dtype(dtype: str) -> None:
    assert CacheConfig(cache_dtype=dtype, kv_cache_quant_type="block_wise_fp8").kv_cache_quant_type == "block_wise_fp8"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_block_wise_fp8_with_16bit_dtype_is_an_error(dtype: str) -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(cache_dtype=dtype, kv_cache_quant_type="block_wise_fp8")
    message = check_error(info.value, "kv_cache_quant_type", "block_wise_fp8")
    assert dtype in message and "cache_dtype" in info.value.fix


@pytest.mark.parametrize("backend", ["none", "None", None])
def test_storage_backend_none(backend: str | None) -> None:
    assert CacheConfig(kvcache_storage_backend=backend).kvcache_storage_backend is None


@pytest.mark.parametrize("backend", ["mooncake", "attention_store", "file"])
def test_storage_backends(backend: str) -> None:
    assert CacheConfig(kvcache_storage_backend=backend).kvcache_storage_backend == backend


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0),
        ("block_size", -64),
        ("block_size", "64"),
        ("block_size", 64.0),
        ("block_size", True),
        ("cache_dtype", "fp4"),
        ("cache_dtype", 8),
        ("kv_cache_quant_type", "int4"),
        ("memory_utilization", 0),
        ("memory_utilization", 0.0),
        ("memory_utilization", 1.01),
        ("memory_utilization", -0.5),
        ("memory_utilization", "0.9"),
        ("memory_utilization", float("nan")),
        ("memory_utilization", True),
        ("num_cpu_blocks", -1),
        ("num_cpu_blocks", 1.5),
        ("swap_space_bytes", -1),
        ("kvcache_storage_backend", "redis"),
        ("num_gpu_blocks_override", 0),
        ("num_gpu_blocks_override", "100"),
    ],
)
def test_cache_rejects(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(**{field: value})  # type: ignore[arg-type]
    check_error(info.value, field, value)


def test_cache_rejects_cpu_blocks_and_swap_space_together() -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(num_cpu_blocks=10, swap_space_bytes=2**30)
    message = check_error(info.value, "swap_space_bytes", 2**30)
    assert "num_cpu_blocks=10" in message and "not both" in info.value.fix


def test_cache_dtype_error_lists_choices_and_alias() -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(cache_dtype="fp4")
    assert "bfloat16, float16, float32, uint8, float8_e4m3, fp8, int8, int8_zp, float8_e4m3fn" in info.value.allowed
    assert "fp8" in info.value.allowed


def test_memory_utilization_one_is_allowed() -> None:
    assert CacheConfig(memory_utilization=1).memory_utilization == 1


# SchedulerConfig / ParallelConfig ------------------------------------------------------------


@pytest.mark.parametrize("role", ["mixed", "prefill", "decode", "Decode"])
def test_splitwise_roles(role: str) -> None:
    assert SchedulerConfig(role).splitwise_role == role.lower()


def test_scheduler_default_and_bad_role() -> None:
    assert SchedulerConfig().splitwise_role == "mixed"
    with pytest.raises(ConfigError) as info:
        SchedulerConfig("both")
    assert "mixed, prefill, decode" in check_error(info.value, "splitwise_role", "both")


def test_parallel_ok() -> None:
    assert ParallelConfig(tensor_parallel_size=4, local_rank=3) == ParallelConfig(4, 3)
    assert ParallelConfig() == ParallelConfig(1, 0)


@pytest.mark.parametrize(
    ("tp", "rank", "field", "value"),
    [
        (0, 0, "tensor_parallel_size", 0),
        (4, 4, "local_rank", 4),
        (4, -1, "local_rank", -1),
        (2, "0", "local_rank", "0"),
    ],
)
def test_parallel_rejects(tp: int, rank: object, field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        ParallelConfig(tensor_parallel_size=tp, local_rank=rank)  # type: ignore[arg-type]
    check_error(info.value, field, value)


# ModelConfig ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"num_key_value_heads": 8}, "mha"),
        ({"num_key_value_heads": 2}, "gqa"),
        ({"num_key_value_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, "mla"),
        ({"num_key_value_heads": 8, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128}, "dsa"),
    ],
)
def test_attention_is_inferred(changes: dict[str, object], kind: str) -> None:
    assert model(**changes).attention == kind


def test_attention_override() -> None:
    assert model(attention="MHA").attention == "mha"
    mla = model(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128, attention="mla")
    assert mla.attention == "mla"


@pytest.mark.parametrize(
    ("kind", "changes", "missing"),
    [
        ("mla", {}, "kv_lora_rank"),
        ("mla", {"kv_lora_rank": 512}, "qk_rope_head_dim"),
        ("dsa", {"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "index_head_dim"),
    ],
)
def test_attention_override_without_needed_field(kind: str, changes: dict[str, object], missing: str) -> None:
    with pytest.raises(ConfigError) as info:
        model(attention=kind, **changes)
    message = check_error(info.value, "attention", kind)
    assert f"{missing} is missing" in message and missing in info.value.fix


def test_attention_unknown() -> None:
    with pytest.raises(ConfigError) as info:
        model(attention="linear")
    assert "mha, gqa, mla, dsa" in check_error(info.value, "attention", "linear")


def test_mtp_layers() -> None:
    assert model(num_nextn_predict_layers=1).num_cache_layers == 4
    assert model(num_nextn_predict_layers=2, use_mtp=True).num_cache_layers == 4 + 2


def test_mtp_without_layers_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        model(use_mtp=True)
    check_error(info.value, "use_mtp", True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_hidden_layers", 0),
        ("num_attention_heads", "8"),
        ("num_key_value_heads", 3),
        ("num_key_value_heads", 16),
        ("head_dim", 0),
        ("kv_lora_rank", 0),
        ("index_head_dim", 1.5),
        ("num_nextn_predict_layers", -1),
        ("use_mtp", "yes"),
    ],
)
def test_model_rejects(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        model(**{field: value})
    check_error(info.value, field, value)


# load_model_config ---------------------------------------------------------------------------


def test_examples_load() -> None:
    qwen = load_model_config(EXAMPLES / "qwen3-30b-a3b")
    assert (qwen.name, qwen.attention) == ("qwen3-30b-a3b", "gqa")
    assert (qwen.num_hidden_layers, qwen.num_attention_heads, qwen.num_key_value_heads, qwen.head_dim) == (
        48,
        32,
        4,
        128,
    )
    llama = load_model_config(EXAMPLES / "llama-3.1-8b" / "config.json")
    assert (llama.name, llama.attention, llama.num_key_value_heads) == ("llama-3.1-8b", "gqa", 8)
    assert llama.head_dim == 4096 // 32
    v3 = load_model_config(EXAMPLES / "deepseek-v3")
    assert (v3.attention, v3.num_hidden_layers, v3.kv_lora_rank, v3.qk_rope_head_dim) == ("mla", 61, 512, 64)
    assert v3.num_nextn_predict_layers == 1 and v3.index_head_dim is None
    assert load_model_config(EXAMPLES / "deepseek-v3", use_mtp=True).num_cache_layers == 62
    v32 = load_model_config(EXAMPLES / "deepseek-v3.2")
    assert (v32.attention, v32.index_head_dim, v32.kv_lora_rank) == ("dsa", 128, 512)


def test_deepseek_kv_heads_do_not_hide_mla() -> None:
    raw = json.loads((EXAMPLES / "deepseek-v3" / "config.json").read_text())
    assert raw["num_key_value_heads"] == raw["num_attention_heads"]
    assert load_model_config(EXAMPLES / "deepseek-v3").attention == "mla"


def test_hf_defaults_mha_and_head_dim(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "gpt", num_hidden_layers=12, num_attention_heads=12, hidden_size=768, head_dim=None)
    loaded = load_model_config(folder)
    assert (loaded.num_key_value_heads, loaded.head_dim, loaded.attention) == (12, 768 // 12, "mha")


def test_hf_name_sources(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "x", _name_or_path="org/model", num_hidden_layers=1, num_attention_heads=1, head_dim=8
    )
    assert load_model_config(folder).name == "org/model"
    file = tmp_path / "tiny.json"
    file.write_text(json.dumps({"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 8}))
    assert load_model_config(file).name == "tiny"


def test_hf_attention_override_and_mtp_errors_have_no_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_model_config(EXAMPLES / "qwen3-30b-a3b", attention="mla")
    check_error(info.value, "attention", "mla")
    with pytest.raises(ConfigError) as info:
        load_model_config(EXAMPLES / "qwen3-30b-a3b", use_mtp=True)
    check_error(info.value, "use_mtp", True)


def test_hf_missing_path_and_folder_without_config_json_say_different_things(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_model_config(tmp_path / "nowhere")
    missing = check_error(info.value, "path", str(tmp_path / "nowhere"))
    assert "nothing is at this path" in missing
    with pytest.raises(ConfigError) as info:
        load_model_config(tmp_path)
    empty = check_error(info.value, "path", str(tmp_path))
    assert "this folder has none" in empty and "nothing is at this path" not in empty


def test_nested_text_config_models_load_their_language_model() -> None:
    gemma = load_model_config(EXAMPLES / "gemma-3-27b")
    facts = (gemma.num_hidden_layers, gemma.num_attention_heads, gemma.num_key_value_heads, gemma.head_dim)
    assert (gemma.name, gemma.attention, gemma.dtype, facts) == ("gemma-3-27b", "gqa", "bfloat16", (62, 32, 16, 128))
    llama4 = load_model_config(EXAMPLES / "llama-4-scout-17b-16e")
    facts = (llama4.num_hidden_layers, llama4.num_attention_heads, llama4.num_key_value_heads, llama4.head_dim)
    assert (llama4.attention, llama4.dtype, facts) == ("gqa", "bfloat16", (48, 40, 8, 128))  # dtype, not torch_dtype


def test_a_key_missing_from_text_config_is_named_there(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "vl", model_type="vl", text_config={"num_attention_heads": 4, "head_dim": 8})
    with pytest.raises(ConfigError) as info:
        load_model_config(folder)
    message = check_error(info.value, "text_config.num_hidden_layers", None, folder / "config.json")
    assert "add text_config.num_hidden_layers to config.json" in message
    write_model(folder, text_config={"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 0})
    with pytest.raises(ConfigError) as info:
        load_model_config(folder)
    check_error(info.value, "text_config.head_dim", 0, folder / "config.json")


def test_top_level_facts_win_over_text_config(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "m",
        num_hidden_layers=3,
        num_attention_heads=4,
        head_dim=8,
        text_config={"num_hidden_layers": 99, "num_attention_heads": 1, "head_dim": 8},
    )
    assert load_model_config(folder).num_hidden_layers == 3


@pytest.mark.parametrize(
    ("fields", "dtype"),
    [
        ({"torch_dtype": "float16"}, "float16"),
        ({"dtype": "float32"}, "float32"),
        ({}, "bfloat16"),
        ({"torch_dtype": None, "dtype": "float16"}, "float16"),
    ],
)
def test_the_model_dtype_comes_from_torch_dtype_or_dtype(tmp_path: Path, fields: dict[str, object], dtype: str) -> None:
    folder = write_model(tmp_path / "m", num_hidden_layers=1, num_attention_heads=1, head_dim=8, **fields)
    assert load_model_config(folder).dtype == dtype


def test_an_unknown_model_dtype_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", num_hidden_layers=1, num_attention_heads=1, head_dim=8, torch_dtype="int4")
    with pytest.raises(ConfigError) as info:
        load_model_config(folder)
    check_error(info.value, "dtype", "int4", folder / "config.json")


def test_hf_bad_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2,,}')
    with pytest.raises(ConfigError) as info:
        load_model_config(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: json=") and "line 1" in message
    assert "Fix:" in message


def test_hf_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError) as info:
        load_model_config(tmp_path)
    check_error(info.value, "json", "list", tmp_path / "config.json")


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"num_attention_heads": 4, "head_dim": 8}, "num_hidden_layers", None),
        ({"num_hidden_layers": 2, "head_dim": 8}, "num_attention_heads", None),
        ({"num_hidden_layers": 2, "num_attention_heads": 4}, "hidden_size", None),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": "64"}, "hidden_size", "64"),
        ({"num_hidden_layers": "2", "num_attention_heads": 4, "head_dim": 8}, "num_hidden_layers", "2"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "kv_lora_rank": "512"},
            "kv_lora_rank",
            "512",
        ),
    ],
)
def test_hf_missing_or_wrong_fields_name_the_file(
    tmp_path: Path, fields: dict[str, object], field: str, value: object
) -> None:
    write_model(tmp_path, **fields)
    with pytest.raises(ConfigError) as info:
        load_model_config(tmp_path)
    check_error(info.value, field, value, tmp_path / "config.json")


# load_deploy_config / deploy_config_from_overrides --------------------------------------------


def test_example_deploy_toml_loads() -> None:
    deploy = load_deploy_config(EXAMPLES / "deploy.toml")
    assert isinstance(deploy, DeployConfig)
    assert deploy.model_path == EXAMPLES / "qwen3-30b-a3b"
    assert deploy.model.name == "qwen3-30b-a3b" and deploy.model.attention == "gqa"
    assert deploy.cache == CacheConfig(block_size=64, cache_dtype="bfloat16", memory_utilization=0.9)
    assert deploy.scheduler == SchedulerConfig("mixed")
    assert deploy.parallel == ParallelConfig(tensor_parallel_size=4, local_rank=0)


def test_model_path_is_relative_to_the_toml_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n')
    monkeypatch.chdir(Path(__file__).parent)
    assert load_deploy_config(str(file)).model_path == tmp_path / "m"


def test_toml_values(tmp_path: Path) -> None:
    file = write_toml(
        tmp_path,
        '[model]\npath = "m"\nattention = "mha"\n'
        '[cache]\nblock_size = 128\ncache_dtype = "fp8"\nkv_cache_quant_type = "block_wise_fp8"\n'
        'memory_utilization = 0.8\nswap_space = "16GiB"\nkvcache_storage_backend = "mooncake"\n'
        "num_gpu_blocks_override = 100\n"
        '[scheduler]\nsplitwise_role = "prefill"\n[parallel]\ntensor_parallel_size = 2\nlocal_rank = 1\n',
    )
    deploy = load_deploy_config(file)
    assert deploy.model.attention == "mha"
    assert deploy.cache == CacheConfig(
        block_size=128,
        cache_dtype="float8_e4m3fn",
        kv_cache_quant_type="block_wise_fp8",
        memory_utilization=0.8,
        swap_space_bytes=16 * 1024**3,
        kvcache_storage_backend="mooncake",
        num_gpu_blocks_override=100,
    )
    assert deploy.scheduler.splitwise_role == "prefill"
    assert deploy.parallel == ParallelConfig(2, 1)


@pytest.mark.parametrize(
    ("written", "expected"),
    [("16", 16 * 2**30), ("1.5", 3 * 2**29), ('"16"', 16 * 2**30), ('"512MiB"', 512 * 2**20), ('"1073741824B"', 2**30)],
)
def test_a_bare_swap_space_is_gib_like_fastdeploys_and_vllms(tmp_path: Path, written: str, expected: int) -> None:
    file = write_toml(tmp_path, f'[model]\npath = "m"\n[cache]\nswap_space = {written}\n')
    assert load_deploy_config(file).cache.swap_space_bytes == expected


def test_overrides_win_over_file_values(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n[cache]\nblock_size = 64\n[parallel]\ntensor_parallel_size = 2\n')
    deploy = load_deploy_config(
        file,
        {"cache": {"block_size": 128, "cache_dtype": None}, "parallel": {"tensor_parallel_size": 4, "local_rank": 3}},
    )
    assert deploy.cache.block_size == 128
    assert deploy.cache.cache_dtype == "bfloat16"  # None means "not given"
    assert deploy.parallel == ParallelConfig(4, 3)


def test_override_model_path_is_not_relative_to_the_file(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n')
    deploy = load_deploy_config(file, {"model": {"path": str(EXAMPLES / "llama-3.1-8b")}})
    assert deploy.model.name == "llama-3.1-8b"


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n[cache]\nblok_size = 64\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "cache.blok_size", 64, file)
    assert info.value.fix == "did you mean 'block_size'?"


def test_unknown_section_did_you_mean(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n[cahce]\nblock_size = 64\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "[cahce]", "cahce", file)
    assert info.value.fix == "did you mean 'cache'?"


def test_unknown_key_without_close_match(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n[scheduler]\nzzz = 1\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    assert "splitwise_role" in info.value.allowed and "remove it" in info.value.fix


def test_unknown_override_key(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file, {"parallel": {"tensor_paralel_size": 2}})
    check_error(info.value, "parallel.tensor_paralel_size", 2)
    assert info.value.fix == "did you mean 'tensor_parallel_size'?"


def test_section_that_is_not_a_table(tmp_path: Path) -> None:
    file = write_toml(tmp_path, 'cache = 3\n[model]\npath = "m"\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "[cache]", 3, file)


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\nblock_size = = 3\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    message = str(info.value)
    assert message.startswith(f"{file}: toml=") and "line 3" in message
    assert info.value.fix == "correct the syntax at line 3"


def test_missing_toml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_deploy_config(tmp_path / "missing.toml")
    check_error(info.value, "config", str(tmp_path / "missing.toml"))


def test_bad_value_in_file_names_section_key_and_file(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n[cache]\nblock_size = 0\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "cache.block_size", 0, file)


def test_bad_value_from_override_names_no_file(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file, {"scheduler": {"splitwise_role": "both"}})
    check_error(info.value, "scheduler.splitwise_role", "both")


@pytest.mark.parametrize(
    ("cache", "field", "value"),
    [
        ('swap_space = "lots"', "cache.swap_space", "lots"),
        ('num_cpu_blocks = 10\nswap_space = "1GiB"', "cache.swap_space", 1024**3),
        ('cache_dtype = "fp4"', "cache.cache_dtype", "fp4"),
        ("local = 1", "cache.local", 1),
    ],
)
def test_cache_section_errors(tmp_path: Path, cache: str, field: str, value: object) -> None:
    file = write_toml(tmp_path, f'[model]\npath = "m"\n[cache]\n{cache}\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, field, value, file)


def test_model_section_errors(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\nattention = "mla"\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    assert "kv_lora_rank" in check_error(info.value, "model.attention", "mla", file)
    file = write_toml(tmp_path, '[model]\npath = "m"\nuse_mtp = true\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "model.use_mtp", True, file)
    file = write_toml(tmp_path, "[model]\npath = 3\n")
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "model.path", 3, file)


def test_model_path_missing_or_wrong(tmp_path: Path) -> None:
    file = write_toml(tmp_path, "[cache]\nblock_size = 64\n")
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "model.path", None, file)
    file = write_toml(tmp_path, '[model]\npath = "nope"\n')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "model.path", str(tmp_path / "nope"), file)


def test_model_config_json_errors_name_the_json_file(tmp_path: Path) -> None:
    file = write_toml(tmp_path, '[model]\npath = "m"\n')
    (tmp_path / "m" / "config.json").write_text('{"num_hidden_layers": 2}')
    with pytest.raises(ConfigError) as info:
        load_deploy_config(file)
    check_error(info.value, "num_attention_heads", None, tmp_path / "m" / "config.json")


def test_mtp_from_toml(tmp_path: Path) -> None:
    file = tmp_path / "deploy.toml"
    file.write_text(f'[model]\npath = "{EXAMPLES / "deepseek-v3"}"\nuse_mtp = true\n')
    assert load_deploy_config(file).model.num_cache_layers == 61 + 1


def test_deploy_config_from_overrides_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model(tmp_path / "m", num_hidden_layers=2, num_attention_heads=4, head_dim=8)
    monkeypatch.chdir(tmp_path)
    deploy = deploy_config_from_overrides(
        {
            "model": {"path": "m"},
            "cache": {"block_size": 32},
            "parallel": {"tensor_parallel_size": 2, "local_rank": None},
        }
    )
    assert deploy.model_path == Path("m") and deploy.model.name == "m"
    assert deploy.cache == CacheConfig(block_size=32)
    assert deploy.scheduler == SchedulerConfig() and deploy.parallel == ParallelConfig(2, 0)


def test_deploy_config_from_overrides_needs_a_model() -> None:
    with pytest.raises(ConfigError) as info:
        deploy_config_from_overrides({"cache": {"block_size": 32}})
    check_error(info.value, "model.path", None)
    assert "command line" in info.value.fix
