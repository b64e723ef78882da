"""FastDeploy's configuration read as it is: an FDConfig-shaped object, or a cache process's command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fastdeploy_config_standin import fd_config
from fd_platforms.contract.errors import ConfigError
from fd_platforms.loading.platform import Platform
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import load_model_config
from fd_platforms.rules.fastdeploy_config import from_cache_manager_args, from_fd_config

from run_helpers import QWEN


@pytest.fixture(scope="module")
def cpu() -> Platform:
    return select_platform({"FD_PLATFORM": "cpu"}).platform


CONFIG_JSON_KEYS = ("_name_or_path", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim")
"""Keys FastDeploy's ModelConfig holds only where the model's config.json has them (MLA, DSA models)."""


class Recording:
    """Wraps one of the stand-in's objects and records every attribute the adapter reads from it."""

    def __init__(self, target: object, path: str, reads: list[tuple[str, bool]]) -> None:
        self._target, self._path, self._reads = target, path, reads

    def __getattr__(self, name: str) -> Any:
        present = hasattr(self._target, name)
        self._reads.append((f"{self._path}.{name}", present))
        value = getattr(self._target, name)
        if hasattr(value, "__dict__") and not isinstance(value, type):
            return Recording(value, f"{self._path}.{name}", self._reads)
        return value


def test_an_fd_config_gives_a_runner_its_settings_without_restating_them() -> None:
    config = fd_config(QWEN, tp=2, swap_space=1, splitwise_role="prefill", port="8002,8012", engine_pid=4242)
    settings = from_fd_config(config, local_rank=1, rule="2026-04")
    assert settings.model == load_model_config(QWEN)
    assert (settings.cache.block_size, settings.cache.memory_utilization) == (64, 0.9)
    assert settings.cache.num_cpu_blocks == config.cache_config.num_cpu_blocks > 0  # FastDeploy's own count
    assert (settings.parallel.tensor_parallel_size, settings.rank) == (2, 1)
    assert (settings.suffix, settings.block_count_suffix) == ("8002", "4242")  # data-parallel rank 0's port
    assert settings.rule_inputs() == {
        "profile": False, "num_cpu_blocks": settings.cache.num_cpu_blocks, "storage_backend": None,
        "splitwise_role": "prefill",
    }  # fmt: skip
    assert settings.cache.rule == "2026-04"


def test_the_adapter_reads_only_names_fastdeploys_config_classes_have() -> None:
    reads: list[tuple[str, bool]] = []
    from_fd_config(Recording(fd_config(QWEN, tp=2, mtp=True), "fd_config", reads), local_rank=0)
    optional = {f"fd_config.model_config.{key}" for key in CONFIG_JSON_KEYS}  # a model's config.json may lack them
    missing = [name for name, present in reads if not present and name not in optional]
    assert reads and not missing, missing


def test_the_tensors_are_named_with_the_physical_device_and_live_on_the_local_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # a second instance on an 8-GPU host
    config = fd_config(QWEN, tp=2)
    ids = [(s.device_id, s.local_device) for s in (from_fd_config(config, local_rank=r) for r in (0, 1))]
    assert ids == [(4, 0), (5, 1)]


@pytest.mark.parametrize(
    ("section", "name"),
    [("cache_config", "block_size"), ("parallel_config", "tensor_parallel_size"), ("model_config", "head_dim")],
)
def test_a_missing_fd_config_attribute_is_named(section: str, name: str) -> None:
    config = fd_config(QWEN)
    setattr(getattr(config, section), name, None)
    with pytest.raises(ConfigError) as caught:
        from_fd_config(config, local_rank=0)
    assert caught.value.field == f"fd_config.{section}.{name}"
    assert "FDConfig" in str(caught.value)


@pytest.mark.parametrize("visible", ["3", "GPU-8f2c,GPU-11aa"])
def test_device_ids_that_do_not_cover_the_local_rank_are_refused(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(ConfigError) as caught:
        from_fd_config(fd_config(QWEN, tp=2), local_rank=1)
    assert caught.value.field == "fd_config.parallel_config.device_ids" and caught.value.value == visible
    assert "Fix: set CUDA_VISIBLE_DEVICES" in str(caught.value)


def manager_args(**changes: object) -> argparse.Namespace:
    """The command line FastDeploy's ``launch_cache_manager`` gives its cache transfer manager for rank 1."""
    args: dict[str, object] = {
        "splitwise_role": "mixed", "rank": 1, "device_id": 5, "num_layers": 48, "mp_num": 2,
        "cache_dtype": "bfloat16", "default_dtype": "bfloat16", "key_cache_shape": "900,2,64,128",
        "value_cache_shape": "900,2,64,128", "engine_worker_queue_port": 8002, "num_cpu_blocks": 85,
        "speculative_config": {}, "create_cache_tensor": False, "kvcache_storage_backend": None,
        "model_path": QWEN, "ipc_suffix": "4242",
    }  # fmt: skip
    args.update(changes)
    return argparse.Namespace(**args)


def test_the_transfer_managers_command_line_gives_the_settings_a_runner_gets() -> None:
    settings = from_cache_manager_args(manager_args())
    runner = from_fd_config(fd_config(QWEN, tp=2), local_rank=1)
    assert settings.model == runner.model and settings.parallel == runner.parallel
    assert (settings.device_id, settings.local_device, settings.num_blocks) == (5, 5, 900)  # it sees every device
    assert (settings.suffix, settings.block_count_suffix, settings.cache.num_cpu_blocks) == ("8002", "4242", 85)


@pytest.mark.parametrize("shape", ["", "900,2,64", "900,2,x,128", "0,2,64,128"])
def test_a_bad_key_cache_shape_is_named(shape: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(key_cache_shape=shape))
    assert caught.value.field == "--key_cache_shape"


def test_a_cache_messager_names_its_model_path() -> None:
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(model_path=None))
    assert caught.value.field == "model_path"


def test_with_mtp_the_layout_has_fastdeploys_draft_layer_after_the_main_ones() -> None:
    settings = from_fd_config(fd_config(QWEN, tp=2, mtp=True), local_rank=0)
    whole = settings.layout()
    assert whole.main().names()[-1] == "value_caches_47_rank0.device0"
    assert whole.draft().names() == ("key_caches_48_rank0.device0", "value_caches_48_rank0.device0")


def test_a_quantized_fd_config_maps_through_the_vocabulary() -> None:
    settings = from_fd_config(fd_config(QWEN, kv_cache_quant_type="block_wise_fp8"), local_rank=0)
    assert (settings.cache.kv_cache_quant_type, settings.cache.cache_dtype) == ("block_wise_fp8", "float8_e4m3fn")
    assert [role.role for role in settings.layout().roles] == ["key", "value", "key_scale", "value_scale"]


@pytest.mark.parametrize(
    ("changes", "quant"),
    [
        ({}, None),
        ({"cache_dtype": "block_wise_fp8"}, "block_wise_fp8"),
        ({"cache_dtype": "uint8", "key_cache_shape": "900,2,64,64", "value_cache_shape": "900,2,64,64"}, "int4_zp"),
        ({"cache_dtype": "uint8"}, "int8"),
    ],
    ids=["bfloat16", "block_wise_fp8", "int4_zp", "int8"],
)
def test_the_managers_command_line_shapes_are_the_runners_layout(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch, changes: dict[str, object], quant: str | None
) -> None:
    """What ``launch_cache_manager`` passes (``--cache_dtype`` is ``uint8`` for every 4- and 8-bit cache) is
    checked as the engine's tensor specs against the layout a runner of the same deployment plans with."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    manager = from_cache_manager_args(manager_args(**changes))
    runner = from_fd_config(fd_config(QWEN, tp=2, kv_cache_quant_type=quant), local_rank=1)
    assert manager.layout().names() == runner.layout().names()  # both name rank 1's tensors .device5
    assert manager.layout().bytes_per_block == runner.layout().bytes_per_block
    shaped = cpu.cache_layout(manager.layout(), 900, manager.tensor_specs)
    assert [spec.shape(900) for spec in shaped.tensors[:2]] == [spec.shape for spec in manager.tensor_specs[:2]]
    assert manager.manager_arguments()["tensor_specs"] == manager.tensor_specs


def test_the_runner_and_manager_arguments_are_the_engine_calls_keywords() -> None:
    import inspect

    from fd_platforms.engine import initialize_kv_cache, manage_kv_cache

    settings = from_cache_manager_args(manager_args(), rule="2026-04")
    for call, arguments in ((initialize_kv_cache, settings.runner_arguments()), (manage_kv_cache,
                                                                                settings.manager_arguments())):
        inspect.signature(call).bind(None, None, None, **arguments)  # a TypeError fails
    assert settings.runner_arguments()["suffix"] == "8002" and settings.manager_arguments()["rule"] == "2026-04"
