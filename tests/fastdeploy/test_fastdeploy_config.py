"""FastDeploy's configuration read as it is: an FDConfig-shaped object, or a cache process's command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastdeploy_config_standin import QuantConfig, engine_fd_config, fd_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_helpers import QWEN

from fd_platforms.contract.errors import ConfigError
from fd_platforms.fastdeploy.config import FastDeploySettings, from_cache_manager_args, from_fd_config
from fd_platforms.fastdeploy.signals import check_suffix
from fd_platforms.loading.platform import Platform
from fd_platforms.rules.config import load_model_config
from fd_platforms.rules.decision import DecisionInputs

LLAMA = "examples/llama-3.1-8b"  # 8 key/value heads: tp16 gives each rank one
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
    request = settings.cache_request(settings.layout().main(), 16)
    assert request.inputs.kwargs() == {
        "profile": False,
        "num_cpu_blocks": settings.cache.num_cpu_blocks,
        "storage_backend": None,
        "splitwise_role": "prefill",
        "rule": "2026-04",
    }
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


@pytest.mark.parametrize(("platform", "tp", "chips"), [("cuda", 8, 8), ("xpu", 8, 8), ("iluvatar", 16, 16)])
def test_on_several_nodes_a_global_rank_names_and_places_its_tensors_on_its_nodes_device(
    monkeypatch: pytest.MonkeyPatch, platform: str, tp: int, chips: int
) -> None:
    """tp x dp2 over 2 nodes, the layout FastDeploy builds: its ``local_rank`` is the global rank
    (``worker_process.py`` ``init_distributed_environment``: ``fleet.worker_index()``), its device
    ``local_rank % max_chips_per_node`` and its tensors' id ``device_ids`` there (``gpu_worker.py`` ``init_device``
    lines 62-91, ``xpu_worker.py`` 60-72), ``max_chips_per_node`` 16 on Iluvatar, else 8 (``config.py``
    ``FDConfig.__init__`` line 1992). Node 1's worker of data-parallel rank 1 has ``local_data_parallel_id``
    ``1 % (max_chips_per_node // tp)`` = 0 (``worker_process.py`` ``initialize_fd_config``). FastDeploy's own
    Iluvatar worker indexes ``device_ids[local_rank]`` without the modulo (``iluvatar_worker.py`` ``init_device``
    lines 57-71): the same on one node, past its node's devices on a second; ours follows FDConfig's 16."""
    visible = ",".join(str(chips - 1 - device) for device in range(chips))  # this node's devices, reversed
    monkeypatch.setenv("XPU_VISIBLE_DEVICES" if platform == "xpu" else "CUDA_VISIBLE_DEVICES", visible)
    global_rank = chips + 1  # rank 1 of node 1
    config = fd_config(QWEN if tp == 8 else LLAMA, tp=tp, dp=2, local_rank=global_rank, platform=platform)
    assert (config.max_chips_per_node, config.nnode, config.parallel_config.local_data_parallel_id) == (chips, 2, 0)
    settings = from_fd_config(config, local_rank=global_rank)
    assert (settings.rank, settings.local_device, settings.device_id) == (1, 1, chips - 2)  # device_ids[1]
    assert settings.layout().names()[0] == f"key_caches_0_rank1.device{chips - 2}"
    assert settings.layout().local_device == 1
    on_node_0 = from_fd_config(config, local_rank=1)  # the same tensor-parallel rank of data-parallel rank 0
    assert on_node_0.layout().names() == settings.layout().names()


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
        "splitwise_role": "mixed",
        "rank": 1,
        "device_id": 5,
        "num_layers": 48,
        "mp_num": 2,
        "cache_dtype": "bfloat16",
        "default_dtype": "bfloat16",
        "key_cache_shape": "900,2,64,128",
        "value_cache_shape": "900,2,64,128",
        "engine_worker_queue_port": 8002,
        "num_cpu_blocks": 85,
        "speculative_config": {},
        "create_cache_tensor": False,
        "kvcache_storage_backend": None,
        "model_path": QWEN,
        "ipc_suffix": "4242",
    }
    args.update(changes)
    return argparse.Namespace(**args)


def quantized_model(folder: Path, quant: str | None, source: str = QWEN, **changes: object) -> str:
    """A copy of ``source``'s config.json stating ``quant`` as FastDeploy's quantized models do: a
    ``quantization_config`` of ``mix_quant`` with ``kv_cache_quant_type`` (``quantization/__init__.py``
    ``parse_quant_config``, ``mix_quant.py`` ``MixQuantConfig.from_config``), ``changes`` applied."""
    raw = json.loads((Path(source) / "config.json").read_text())
    if quant is not None:
        raw["quantization_config"] = {
            "quantization": "mix_quant",
            "dense_quant_type": "wint8",
            "moe_quant_type": "wint4",
            "kv_cache_quant_type": quant,
        }
    raw.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


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
        ({"cache_dtype": "uint8"}, "float8_e4m3"),
    ],
    ids=["bfloat16", "block_wise_fp8", "int4_zp", "int8", "float8_e4m3"],
)
def test_the_managers_command_line_shapes_are_the_runners_layout(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, changes: dict[str, object], quant: str | None
) -> None:
    """What ``launch_cache_manager`` passes (``--cache_dtype`` is ``uint8`` for every 4- and 8-bit cache, the
    quantization read from the model's config.json) is checked as the engine's tensor specs against the layout a
    runner of the same deployment plans with."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    model = quantized_model(tmp_path / "m", quant)
    config = fd_config(model, tp=2)
    assert config.cache_config.cache_dtype == changes.get("cache_dtype", "bfloat16")  # what launch_cache_manager passes
    manager = from_cache_manager_args(manager_args(**changes, model_path=model))
    runner = from_fd_config(config, local_rank=1)
    assert manager.cache.cache_dtype == runner.cache.cache_dtype
    assert manager.cache.kv_cache_quant_type == runner.cache.kv_cache_quant_type
    assert manager.layout().names() == runner.layout().names()  # both name rank 1's tensors .device5
    assert manager.layout().bytes_per_block == runner.layout().bytes_per_block
    shaped = cpu.cache_layout(manager.layout(), 900, manager.tensor_specs)
    assert [spec.shape(900) for spec in shaped.tensors[:2]] == [spec.shape for spec in manager.tensor_specs[:2]]
    assert dataclasses.replace(manager, rule="2026-01").cache_request().tensor_specs == manager.tensor_specs


@pytest.mark.parametrize(
    ("quantization", "width"), [("int8", 128), ("float8_e4m3", 128), ("int4_zp", 64)], ids=["int8", "fp8", "int4_zp"]
)
def test_a_cache_process_of_an_engine_quantized_by_its_flag_starts_with_fastdeploys_block_bytes(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch, quantization: str, width: int
) -> None:
    """B3: an engine run with ``--quantization`` (its FDConfig's quant_config; the model's config.json states none)
    gives its transfer manager ``--cache_dtype uint8`` and the shapes its attention backend states, never the
    quantization (``cache_transfer_manager.py`` ``parse_args`` has no such flag). The stated key width says what the
    tensors hold, so the manager allocates FastDeploy's block bytes; before, it was refused."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    runner = from_fd_config(fd_config(QWEN, tp=2, kv_cache_quant_type=quantization), local_rank=1)
    shape = f"900,2,64,{width}"
    manager = from_cache_manager_args(
        manager_args(cache_dtype="uint8", key_cache_shape=shape, value_cache_shape=shape, num_cpu_blocks=0)
    )
    assert manager.layout().bytes_per_block == runner.layout().bytes_per_block  # FastDeploy's block bytes
    assert manager.layout().names() == runner.layout().names()
    shaped = cpu.cache_layout(manager.layout(), 900, manager.tensor_specs)
    assert [(spec.shape(900), spec.dtype) for spec in shaped.tensors[:2]] == [((900, 2, 64, width), "uint8")] * 2


def test_a_uint8_key_of_neither_width_is_refused_naming_the_flag() -> None:
    shape = "900,2,64,96"
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(cache_dtype="uint8", key_cache_shape=shape, value_cache_shape=shape))
    assert caught.value.field == "--key_cache_shape"


@pytest.mark.parametrize(
    ("quant", "flag"),
    [("int8", "bfloat16"), ("int4_zp", "block_wise_fp8"), ("block_wise_fp8", "uint8")],
)
def test_a_cache_dtype_flag_the_models_quantization_does_not_make_is_refused(
    tmp_path: Path, quant: str | None, flag: str
) -> None:
    """The flag is what FastDeploy's CacheConfig made of the model's kv_cache_quant_type: another is another model."""
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(cache_dtype=flag, model_path=quantized_model(tmp_path, quant)))
    assert caught.value.field in ("--cache_dtype", "quantization_config.kv_cache_quant_type")
    assert caught.value.field == "--cache_dtype" or quant is None


@pytest.mark.parametrize("quant", ["bogus", 3, ["int8"]])
def test_a_quantization_fastdeploy_does_not_know_is_refused_naming_the_config_json_key(
    tmp_path: Path, quant: object
) -> None:
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(cache_dtype="uint8", model_path=quantized_model(tmp_path, quant)))
    assert caught.value.field == "quantization_config.kv_cache_quant_type" and caught.value.value == quant
    assert caught.value.source == str(tmp_path / "config.json")


@pytest.mark.usefixtures("fastdeploy_record_names")
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_with_mla_and_int4_zp_the_transfer_manager_attaches_to_what_the_runner_published(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """DeepSeek-V3's MLA with int4_zp, swap space, rule 2026-04: the runner creates what FastDeploy's runner
    allocates (``gpu_model_runner.py`` ``initialize_kv_cache``: uint8, the MLA backend's full-width latent,
    ``mla_attention_backend.py`` ``get_kv_cache_shape``), and the transfer manager, from the command line
    ``launch_cache_manager`` gives it (``--cache_dtype uint8``, ``--key_cache_shape N,1,64,576``, no value), reads
    the quantization from the model's config.json and attaches to that, zero-copy."""
    from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
    from fd_platforms.fastdeploy.protocol import FASTDEPLOY

    monkeypatch.setenv("FD_ATTENTION_BACKEND", "MLA_ATTN")  # as FastDeploy serves DeepSeek-V3
    model = quantized_model(tmp_path / "m", "int4_zp", "examples/deepseek-v3", num_hidden_layers=2)
    config = fd_config(model, num_cpu_blocks=2)
    runner = from_fd_config(config, local_rank=0, rule="2026-04")
    blocks = 4
    suffix, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made:
        created = initialize_kv_cache(cpu, runner.cache_request(num_blocks=blocks, instance=suffix))
        try:
            assert created.created and [list(t.shape) for t in created.tensors] == [[blocks, 1, 64, 576]] * 2
            args = manager_args(
                rank=0,
                mp_num=1,
                device_id=0,
                num_layers=2,
                cache_dtype=config.cache_config.cache_dtype,
                key_cache_shape=f"{blocks},1,64,576",
                value_cache_shape="",
                model_path=model,
                num_cpu_blocks=2,
            )
            manager = from_cache_manager_args(args, rule="2026-04")
            assert (manager.cache.kv_cache_quant_type, manager.layout().roles) == ("int4_zp", runner.layout().roles)
            managed = manage_kv_cache(cpu, manager.cache_request(instance=suffix, creator_pid=os.getpid(), timeout=30))
            try:
                assert not managed.created and str(managed.kv_cache.tensors[0].dtype).endswith("uint8")
                created.tensors[1][3, 0, 63, 575] = 7
                assert int(managed.kv_cache.tensors[1][3, 0, 63, 575]) == 7, "the runner's tensor, attached"
            finally:
                managed.clear(30)
        finally:
            created.clear(30)


def test_the_settings_give_the_request_record_of_fastdeploys_protocol_its_suffix_pin_and_tp() -> None:
    from fd_platforms.engine import CacheRequest
    from fd_platforms.fastdeploy import FASTDEPLOY

    manager = from_cache_manager_args(manager_args(), rule="2026-04")
    layout = manager.layout()
    made = manager.cache_request(layout)
    assert made == CacheRequest(
        layout=layout,
        num_blocks=manager.num_blocks,
        num_cpu_blocks=manager.cache.num_cpu_blocks,
        splitwise_role=manager.splitwise_role,
        protocol="fastdeploy",
        instance="8002",
        rule="2026-04",
        tp=manager.parallel.tensor_parallel_size,
        tensor_specs=manager.tensor_specs,
    )
    assert made.protocol is FASTDEPLOY and made.instance == "8002" and made.tp == manager.parallel.tensor_parallel_size
    assert made.tensor_specs == manager.tensor_specs and made.rule == "2026-04"
    runner = from_fd_config(fd_config(QWEN, tp=2), local_rank=1)
    request = runner.cache_request(runner.layout(), 64, profile=True, timeout=5)
    assert request.profile and request.timeout == 5 and request.num_blocks == 64 and request.tensor_specs is None
    with pytest.raises(ConfigError) as caught:
        runner.cache_request()  # a runner's settings hold no block count: its plan does
    assert caught.value.field == "num_blocks"


# FastDeploy-shaped values read right or refused at the adapter, naming FastDeploy's own attribute or flag.

NAN = float("nan")


@pytest.mark.parametrize(
    ("section", "name", "value"),
    [
        ("parallel_config", "tensor_parallel_size", 0),
        ("parallel_config", "tensor_parallel_size", "2"),
        ("parallel_config", "tensor_parallel_size", True),
        ("parallel_config", "local_engine_worker_queue_port", "abc"),
        ("parallel_config", "local_engine_worker_queue_port", NAN),
        ("parallel_config", "local_engine_worker_queue_port", "8002,8003"),
        ("parallel_config", "local_engine_worker_queue_port", [8002]),
        ("parallel_config", "local_engine_worker_queue_port", 8002.9),
        ("parallel_config", "engine_worker_queue_port", []),
        ("parallel_config", "local_data_parallel_id", 2),
        ("parallel_config", "local_data_parallel_id", -1),
        ("parallel_config", "device_ids", "0,\u00b2"),
        ("parallel_config", "device_ids", "0,\u0663"),
        ("scheduler_config", "splitwise_role", "bogus"),
        ("cache_config", "num_cpu_blocks", -1),
        ("cache_config", "kvcache_storage_backend", "../x"),
        ("model_config", "num_hidden_layers", 1e30),
        ("speculative_config", "num_extra_cache_layer", "1"),
        ("speculative_config", "num_extra_cache_layer", None),
        ("speculative_config", "num_gpu_block_expand_ratio", "abc"),
        ("speculative_config", "num_gpu_block_expand_ratio", 0),
        ("speculative_config", "num_gpu_block_expand_ratio", NAN),
    ],
)
def test_a_bad_fd_config_value_is_refused_naming_fastdeploys_attribute(section: str, name: str, value: object) -> None:
    config = fd_config(QWEN, tp=2, port="8002,8012", mtp=True)
    setattr(getattr(config, section), name, value)
    with pytest.raises(ConfigError) as caught:
        from_fd_config(config, local_rank=1)
    assert caught.value.field == f"fd_config.{section}.{name}"
    assert "Fix: " in str(caught.value)


@pytest.mark.parametrize(
    "spec",
    ['{"method": "mtp"}', ["mtp"], {"method": "mtp"}, object()],
    ids=["json-text", "list", "dict", "bare-object"],
)
def test_a_speculative_config_that_is_not_fastdeploys_object_is_refused(spec: object) -> None:
    config = fd_config(QWEN, tp=2)
    config.speculative_config = spec
    with pytest.raises(ConfigError) as caught:
        from_fd_config(config, local_rank=1)
    assert caught.value.field.startswith("fd_config.speculative_config")


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"mp_num": 0}, "--mp_num"),
        ({"mp_num": "2"}, "--mp_num"),
        ({"rank": 2}, "--rank"),
        ({"rank": -1}, "--rank"),
        ({"device_id": True}, "--device_id"),
        ({"engine_worker_queue_port": "abc"}, "--engine_worker_queue_port"),
        ({"engine_worker_queue_port": NAN}, "--engine_worker_queue_port"),
        ({"engine_worker_queue_port": 8002.9}, "--engine_worker_queue_port"),
        ({"engine_worker_queue_port": [8002]}, "--engine_worker_queue_port"),
        ({"key_cache_shape": "900,2,64,12\u00b2"}, "--key_cache_shape"),
        ({"key_cache_shape": "900,4,64,128", "value_cache_shape": "900,4,64,128"}, "--key_cache_shape"),
        ({"value_cache_shape": "900,2,64,12\u00b2"}, "--value_cache_shape"),
        ({"value_cache_shape": "450,2,128,128"}, "--value_cache_shape"),  # the same bytes in other blocks
        ({"splitwise_role": "bogus"}, "--splitwise_role"),
        ({"ipc_suffix": "../x"}, "--ipc_suffix"),
        ({"ipc_suffix": "1e+30"}, "--ipc_suffix"),
        ({"num_cpu_blocks": -1}, "--num_cpu_blocks"),
        ({"num_layers": 47}, "--num_layers"),
        ({"speculative_config": '{"method": "mtp"}'}, "--speculative_config"),
        ({"speculative_config": ["mtp"]}, "--speculative_config"),
        ({"speculative_config": object()}, "--speculative_config"),
        (
            {"speculative_config": {"method": "mtp", "num_extra_cache_layer": "1"}},
            "--speculative_config.num_extra_cache_layer",
        ),
        (
            {"speculative_config": {"method": "mtp", "num_extra_cache_layer": None}},
            "--speculative_config.num_extra_cache_layer",
        ),
        (
            {"speculative_config": {"method": "mtp", "num_gpu_block_expand_ratio": "abc"}},
            "--speculative_config.num_gpu_block_expand_ratio",
        ),
        (
            {"speculative_config": {"method": "mtp", "num_gpu_block_expand_ratio": 0}},
            "--speculative_config.num_gpu_block_expand_ratio",
        ),
        ({"speculative_config": {"method": "bogus"}}, "--speculative_config.method"),
        ({"cache_dtype": "block_wise_fp8", "default_dtype": "uint8"}, "--default_dtype"),
    ],
)
def test_a_bad_cache_manager_flag_is_refused_naming_the_flag(changes: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(manager_args(**changes))
    assert caught.value.field == flag
    assert "Fix: " in str(caught.value)


def test_mtp_with_no_extra_cache_layer_is_refused_by_the_runner_and_the_manager_alike() -> None:
    """FastDeploy's SpeculativeConfig computes num_extra_cache_layer from the method (1 for mtp), and its transfer
    manager allocates that many draft layers whatever it is given: a config stating 0 with mtp is refused on both
    sides, never a draft for one and none for the other."""
    config = fd_config(QWEN, tp=2, mtp=True)
    config.speculative_config.num_extra_cache_layer = 0
    with pytest.raises(ConfigError) as runner:
        from_fd_config(config, local_rank=1)
    with pytest.raises(ConfigError) as manager:
        from_cache_manager_args(manager_args(speculative_config={"method": "mtp", "num_extra_cache_layer": 0}))
    assert runner.value.field == "fd_config.speculative_config.num_extra_cache_layer"
    assert manager.value.field == "--speculative_config.num_extra_cache_layer"


def test_with_mtp_the_runner_and_the_manager_hold_the_same_draft_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastDeploy matches the method case-insensitively (``SpecMethod.from_string``), on both sides."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    runner = from_fd_config(fd_config(QWEN, tp=2, mtp=True), local_rank=1)
    manager = from_cache_manager_args(manager_args(speculative_config={"method": "MTP", "num_extra_cache_layer": 1}))
    assert runner.layout().draft().names() == manager.layout().draft().names()
    assert manager.cache.num_gpu_block_expand_ratio == runner.cache.num_gpu_block_expand_ratio == 1.0


@pytest.mark.parametrize(
    ("quant", "dp_rank"),
    [("int8", 0), ("float8_e4m3fn", 0), ("float8_e4m3", 0), ("int4_zp", 0), ("block_wise_fp8", 0), (None, 1)],
)
def test_the_engine_processes_fd_config_is_refused_where_the_workers_reads_right(
    quant: str | None, dp_rank: int
) -> None:
    """The engine's FDConfig (EngineArgs.create_engine_config) has no quant_config, no engine_pid and data-parallel
    rank 0's port; the worker's of the same deployment (worker_process.py) has all three."""
    local_rank = 2 * dp_rank + 1
    worker = from_fd_config(
        fd_config(QWEN, tp=2, dp=2, local_data_parallel_id=dp_rank, port="8002,8012", kv_cache_quant_type=quant),
        local_rank=local_rank,
    )
    assert (worker.cache.kv_cache_quant_type, worker.cache.cache_dtype) == {
        "int8": ("none", "int8"),
        "float8_e4m3fn": ("none", "float8_e4m3fn"),
        "int4_zp": ("int4_zp", "bfloat16"),
        "float8_e4m3": ("none", "float8_e4m3fn"),
        "block_wise_fp8": ("block_wise_fp8", "float8_e4m3fn"),
        None: ("none", "bfloat16"),
    }[quant]
    assert (worker.suffix, worker.block_count_suffix) == (("8002", "8012")[dp_rank], "4242")
    engine = engine_fd_config(QWEN, tp=2, dp=2, port="8002,8012", kv_cache_quant_type=quant)
    with pytest.raises(ConfigError) as caught:
        from_fd_config(engine, local_rank=local_rank)
    assert caught.value.field == "fd_config.parallel_config.engine_pid"
    assert "worker process" in str(caught.value) and "create_engine_config" in str(caught.value)


@pytest.mark.parametrize("quant", ["int8", "float8_e4m3", "int4_zp", "block_wise_fp8"])
def test_a_quantized_cache_without_its_quant_config_is_refused(quant: str) -> None:
    config = fd_config(QWEN, tp=2, kv_cache_quant_type=quant)
    config.quant_config = None  # as the engine's FDConfig holds it
    with pytest.raises(ConfigError) as caught:
        from_fd_config(config, local_rank=1)
    assert caught.value.field == "fd_config.quant_config"
    assert "cache_dtype" in caught.value.allowed


def test_a_port_list_is_read_in_every_form_fastdeploys_parse_ports_takes() -> None:
    for ports in ("8002,8012", [8002, 8012], ["8002", "8012"], 8002):
        config = fd_config(QWEN, tp=2, port="8002")
        config.parallel_config.engine_worker_queue_port = ports
        config.parallel_config.local_engine_worker_queue_port = None
        assert from_fd_config(config, local_rank=1).suffix == "8002"


# Every attribute the adapter reads, fed FastDeploy-shaped values: read as the value means, or refused naming it.

REFUSED = object()
"""What a value that FastDeploy's config cannot mean here must give: a ConfigError naming the attribute."""
MISSING = object()
M, C, P, S = (
    "fd_config.model_config",
    "fd_config.cache_config",
    "fd_config.parallel_config",
    "fd_config.speculative_config",
)
ROLES, BACKENDS, METHODS = (
    ("mixed", "prefill", "decode"),
    ("mooncake", "attention_store", "file"),
    ("naive", "mtp", "ngram", "suffix"),
)
SIXTEEN_BIT = ("bfloat16", "float16", "float32")
CACHE_DTYPE_FLAG = {
    "bfloat16": ("bfloat16", "none"),
    "block_wise_fp8": ("float8_e4m3fn", "block_wise_fp8"),
    "uint8": ("uint8", "none"),
}
"""What --cache_dtype means: (cache dtype, quantization) for a 128-wide key, as the runner's layout has them, with a
model whose config.json states no quantization (``uint8``: a byte a value, as every 8-bit quantization stores it)."""


def whole(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def real(value: Any, high: float) -> bool:
    """A finite number above 0 and at most ``high``."""
    return (type(value) is int or (type(value) is float and math.isfinite(value))) and 0 < value <= high


def ascii_numbers(text: object, low: int, high: int) -> list[int] | None:
    """Comma-separated ASCII digits within the bounds, or None."""
    if not isinstance(text, str):
        return None
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,19}", part) and low <= int(part) <= high for part in parts):
        return None
    return [int(part) for part in parts]


def port_list(value: Any) -> list[Any] | None:
    """What FastDeploy's parse_ports makes of a value, where every entry is a port."""
    if whole(value, 1, 65535):
        return [value]
    if isinstance(value, str):
        return ascii_numbers(value, 1, 65535)
    if isinstance(value, (list, tuple)) and value:
        entries = [
            entry
            if whole(entry, 1, 65535)
            else (ascii_numbers(entry, 1, 65535) or [None])[0]
            if isinstance(entry, str) and "," not in entry
            else None
            for entry in value
        ]
        return None if None in entries else entries
    return None


def speculative_meaning(get: Callable[[str], Any]) -> object:
    """``(cache layers, expand ratio)`` a speculative config means for the 48-layer model, or REFUSED."""
    method, extra, ratio = get("method"), get("num_extra_cache_layer"), get("num_gpu_block_expand_ratio")
    method = method.lower() if isinstance(method, str) else method
    if MISSING in (method, ratio) or (method is not None and method not in METHODS):
        return REFUSED
    layers = 1 if method == "mtp" else 0
    if (extra is not MISSING and not whole(extra, layers, layers)) or not real(ratio, 64):
        return REFUSED
    return 48 + layers, float(ratio)


def object_speculative(value: object) -> object:
    if value is None or isinstance(value, (str, bytes, int, float, dict, list, tuple, set)):
        return REFUSED
    return speculative_meaning(lambda name: getattr(value, name, MISSING))


def dict_speculative(value: object) -> object:
    if not isinstance(value, dict):
        return REFUSED
    defaults = {"method": None, "num_gpu_block_expand_ratio": 1.0}
    return speculative_meaning(lambda name: value.get(name, defaults.get(name, MISSING)))


def quant_meaning(quant_config: object) -> object:
    words = {
        None: ("bfloat16", "none"),
        "int8": ("int8", "none"),
        "int8_zp": ("int8", "none"),
        "float8_e4m3fn": ("float8_e4m3fn", "none"),
        "float8_e4m3fn_zp": ("float8_e4m3fn", "none"),
        "float8_e4m3": ("float8_e4m3fn", "none"),
        "block_wise_fp8": ("float8_e4m3fn", "block_wise_fp8"),
        "int4_zp": ("bfloat16", "int4_zp"),
    }
    word = getattr(quant_config, "kv_cache_quant_type", None)  # FastDeploy's runner: hasattr(quant_config, ...)
    word = word.lower() if isinstance(word, str) else word
    return words.get(word, REFUSED) if word is None or isinstance(word, str) else REFUSED


def cache_of(settings: FastDeploySettings) -> tuple[object, ...]:
    return settings.model.num_cache_layers, settings.cache.num_gpu_block_expand_ratio


@dataclass(frozen=True)
class Attribute:
    """One value the adapter reads: ``name`` (FastDeploy's attribute or flag, which an error must name), how a test
    puts a value there, what FastDeploy makes of it (or REFUSED), where the settings hold it, values worth trying,
    and the attributes a refusal may name instead (where the value conflicts with theirs)."""

    name: str
    put: Callable[[Any, object], None]
    meaning: Callable[[Any], object]
    read: Callable[[FastDeploySettings], object]
    good: tuple[object, ...] = ()
    also: tuple[str, ...] = ()
    mtp: bool = False


def attr(path: str) -> Callable[[Any, object], None]:
    """Sets ``fd_config.<path>`` (a section's attribute, or a section itself)."""
    *sections, name = path.split(".")[1:]

    def put(config: Any, value: object) -> None:
        for section in sections:
            config = getattr(config, section)
        setattr(config, name, value)

    return put


def flag(name: str) -> Callable[[Any, object], None]:
    return lambda args, value: setattr(args, name, value)


def spec_key(key: str) -> Callable[[Any, object], None]:
    return lambda args, value: setattr(args, "speculative_config", {key: value})


def kind_of_heads(value: Any) -> object:
    """The model's 32 heads split by 2 ranks need 1 KV head or more dividing 32 and 2 (either way)."""
    if value is None or (type(value) is int and value == -1):
        return 32
    return value if whole(value, 1, 65536) and 32 % value == 0 and (value % 2 == 0 or 2 % value == 0) else REFUSED


FD_ATTRIBUTES = (
    Attribute(
        f"{P}.tensor_parallel_size",
        attr(f"{P}.tensor_parallel_size"),
        lambda v: v if whole(v, 1, 65536) and 32 % v == 0 and (4 % v == 0 or v % 4 == 0) else REFUSED,
        lambda s: s.parallel.tensor_parallel_size,
        (1, 2, 3, 4, 8, 64),
    ),
    Attribute(
        f"{P}.device_ids",
        attr(f"{P}.device_ids"),
        lambda v: ids[1] if (ids := ascii_numbers(v, 0, 2**31 - 1)) and len(ids) > 1 else REFUSED,
        lambda s: s.device_id,
        ("4,5", " 6 , 7", "0,1,2,3", "0", "GPU-1,GPU-2", "0,2147483648"),
    ),
    Attribute(
        "fd_config.max_chips_per_node",
        attr("fd_config.max_chips_per_node"),
        lambda v: (1 % v, 1 % v) if whole(v, 1, 65536) else REFUSED,
        lambda s: (s.local_device, s.device_id),
        (8, 16, 1, 2, 65536, 65537, 0, "8", 8.0),
    ),
    Attribute(
        f"{P}.engine_worker_queue_port",
        attr(f"{P}.engine_worker_queue_port"),
        lambda v: "8002" if (ports := port_list(v)) and ports[0] == 8002 else REFUSED,
        lambda s: s.suffix,
        ("8002", 8002, [8002, 9000], ["8002", "8012"], "8002,8012", "9000", (8002,), [8002.0]),
        also=(f"{P}.local_engine_worker_queue_port",),
    ),
    Attribute(
        f"{P}.local_engine_worker_queue_port",
        attr(f"{P}.local_engine_worker_queue_port"),
        lambda v: "8002" if v is None or whole(v, 8002, 8002) else REFUSED,
        lambda s: s.suffix,
        (None, 8002, 8012, 8002.0),
    ),
    Attribute(
        f"{P}.local_data_parallel_id",
        attr(f"{P}.local_data_parallel_id"),
        lambda v: "8002" if whole(v, 0, 0) else REFUSED,
        lambda s: s.suffix,
        (0, 1, 2, -1, -2),
        also=(f"{P}.local_engine_worker_queue_port",),
    ),
    Attribute(
        f"{P}.engine_pid",
        attr(f"{P}.engine_pid"),
        lambda v: str(v) if whole(v, 1, 2**31 - 1) else REFUSED,
        lambda s: s.block_count_suffix,
        (1, 4242, 2**31 - 1, 2**31, "4242"),
    ),
    Attribute(
        "fd_config.scheduler_config.splitwise_role",
        attr("fd_config.scheduler_config.splitwise_role"),
        lambda v: v if v in ROLES and type(v) is str else REFUSED,
        lambda s: s.splitwise_role,
        (*ROLES, "MIXED", "Prefill"),
    ),
    Attribute(
        f"{C}.block_size",
        attr(f"{C}.block_size"),
        lambda v: v if whole(v, 1, 65536) else REFUSED,
        lambda s: s.cache.block_size,
        (1, 64, 65536, 65537),
    ),
    Attribute(
        f"{C}.gpu_memory_utilization",
        attr(f"{C}.gpu_memory_utilization"),
        lambda v: float(v) if real(v, 1) else REFUSED,
        lambda s: s.cache.memory_utilization,
        (0.5, 1, 1.0, 0.0, 1.5, "0.9"),
    ),
    Attribute(
        f"{C}.num_cpu_blocks",
        attr(f"{C}.num_cpu_blocks"),
        lambda v: v if whole(v, 0, 2**63 - 1) else REFUSED,
        lambda s: s.cache.num_cpu_blocks,
        (0, 85, 2**63 - 1, 2**63),
    ),
    Attribute(
        f"{C}.kvcache_storage_backend",
        attr(f"{C}.kvcache_storage_backend"),
        lambda v: v if v is None or (type(v) is str and v in BACKENDS) else REFUSED,
        lambda s: s.cache.kvcache_storage_backend,
        (None, *BACKENDS, "none", "Mooncake"),
    ),
    Attribute(
        f"{C}.num_gpu_blocks_override",
        attr(f"{C}.num_gpu_blocks_override"),
        lambda v: v if v is None or whole(v, 1, 2**63 - 1) else REFUSED,
        lambda s: s.cache.num_gpu_blocks_override,
        (None, 1, 900, 0),
    ),
    Attribute(
        f"{C}.cache_dtype",
        attr(f"{C}.cache_dtype"),
        lambda v: "bfloat16" if isinstance(v, str) and v.lower() in SIXTEEN_BIT else REFUSED,
        lambda s: s.cache.cache_dtype,
        ("bfloat16", "float16", "uint8", "int8", "block_wise_fp8", "int4_zp"),
        also=("fd_config.quant_config",),
    ),
    Attribute(
        "fd_config.quant_config",
        attr("fd_config.quant_config"),
        quant_meaning,
        lambda s: (s.cache.cache_dtype, s.cache.kv_cache_quant_type),
        tuple(
            QuantConfig(word)
            for word in (
                None,
                "int8",
                "int8_zp",
                "float8_e4m3fn",
                "float8_e4m3fn_zp",
                "float8_e4m3",
                "block_wise_fp8",
                "int4_zp",
                "bogus",
                3,
            )
        ),
        also=("fd_config.quant_config.kv_cache_quant_type",),
    ),
    Attribute(
        S,
        attr(S),
        object_speculative,
        cache_of,
        tuple(
            SimpleNamespace(method=method, num_extra_cache_layer=extra, num_gpu_block_expand_ratio=ratio)
            for method, extra, ratio in (
                (None, 0, 1.0),
                ("mtp", 1, 1),
                ("MTP", 1, 0.5),
                ("ngram", 0, 2.0),
                ("mtp", 0, 1.0),
                ("bogus", 0, 1.0),
                ("mtp", 1, "1"),
            )
        ),
        also=(f"{S}.method", f"{S}.num_extra_cache_layer", f"{S}.num_gpu_block_expand_ratio"),
    ),
    Attribute(
        f"{S}.method",
        attr(f"{S}.method"),
        lambda v: (49, 1.0) if isinstance(v, str) and v.lower() == "mtp" else REFUSED,
        cache_of,
        ("mtp", "MTP", "Mtp", "ngram", None),
        also=(f"{S}.num_extra_cache_layer",),
        mtp=True,
    ),
    Attribute(
        f"{S}.num_extra_cache_layer",
        attr(f"{S}.num_extra_cache_layer"),
        lambda v: (49, 1.0) if whole(v, 1, 1) else REFUSED,
        cache_of,
        (0, 1, 2, "1", 1.0),
        mtp=True,
    ),
    Attribute(
        f"{S}.num_gpu_block_expand_ratio",
        attr(f"{S}.num_gpu_block_expand_ratio"),
        lambda v: (49, float(v)) if real(v, 64) else REFUSED,
        cache_of,
        (0.5, 1, 2.0, 64, 64.5, 0, "1", 5e-324),  # the last: a subnormal, whose inverse is inf
        mtp=True,
    ),
    Attribute(
        f"{M}.num_hidden_layers",
        attr(f"{M}.num_hidden_layers"),
        lambda v: v if whole(v, 1, 10_000) else REFUSED,
        lambda s: s.model.num_hidden_layers,
        (1, 48, 10_001),
    ),
    Attribute(
        f"{M}.num_attention_heads",
        attr(f"{M}.num_attention_heads"),
        lambda v: v if whole(v, 1, 65536) and v % 4 == 0 else REFUSED,
        lambda s: s.model.num_attention_heads,
        (4, 32, 64, 6, 2),
        also=(f"{M}.num_key_value_heads",),
    ),
    Attribute(
        f"{M}.num_key_value_heads",
        attr(f"{M}.num_key_value_heads"),
        kind_of_heads,
        lambda s: s.model.num_key_value_heads,
        (None, -1, -1.0, 1, 2, 4, 32, 3, 64),
        also=(f"{P}.tensor_parallel_size",),
    ),
    Attribute(
        f"{M}.head_dim",
        attr(f"{M}.head_dim"),
        lambda v: v if whole(v, 1, 65536) else REFUSED,
        lambda s: s.model.head_dim,
        (64, 128, 65537),
    ),
    Attribute(
        f"{M}.dtype",
        attr(f"{M}.dtype"),
        lambda v: v if type(v) is str and v in ("bfloat16", "float16", "float32") else REFUSED,
        lambda s: s.model.dtype,
        ("bfloat16", "float16", "float32", "BFloat16", "fp16"),
    ),
    Attribute(
        f"{M}.model",
        attr(f"{M}.model"),
        lambda v: os.path.basename(v.rstrip("/")) if isinstance(v, str) and v.strip() else REFUSED,
        lambda s: s.model.name,
        (QWEN, QWEN + "/", ""),
    ),
    Attribute(
        f"{M}._name_or_path",
        attr(f"{M}._name_or_path"),
        lambda v: "qwen3-30b-a3b" if v is None else v if isinstance(v, str) and v.strip() else REFUSED,
        lambda s: s.model.name,
        (None, "Qwen/Qwen3-30B-A3B", ""),
    ),
    Attribute(
        f"{M}.kv_lora_rank",
        attr(f"{M}.kv_lora_rank"),
        lambda v: None if v is None else REFUSED,
        lambda s: s.model.kv_lora_rank,
        (None, 512),
        also=(f"{M}.qk_rope_head_dim",),
    ),
    Attribute(
        f"{M}.qk_rope_head_dim",
        attr(f"{M}.qk_rope_head_dim"),
        lambda v: v if v is None or whole(v, 1, 65536) else REFUSED,
        lambda s: s.model.qk_rope_head_dim,
        (None, 64),
    ),
    Attribute(
        f"{M}.index_head_dim",
        attr(f"{M}.index_head_dim"),
        lambda v: None if v is None else REFUSED,
        lambda s: s.model.index_head_dim,
        (None, 128),
        also=(f"{M}.kv_lora_rank",),
    ),
    Attribute(
        f"{M}.num_nextn_predict_layers",
        attr(f"{M}.num_nextn_predict_layers"),
        lambda v: 0 if v is None else v if whole(v, 0, 10_000) else REFUSED,
        lambda s: s.model.num_nextn_predict_layers,
        (None, 0, 1, 10_001),
    ),
)

SPEC_KEYS = {
    "method": ("mtp", "MTP", "ngram", None, "bogus"),
    "num_extra_cache_layer": (0, 1, "1", None),
    "num_gpu_block_expand_ratio": (0.5, 1, 0, "1", None),
}

CLI_ATTRIBUTES = (
    Attribute("--rank", flag("rank"), lambda v: v if whole(v, 0, 1) else REFUSED, lambda s: s.rank, (0, 1, 2, -1)),
    Attribute(
        "--mp_num",
        flag("mp_num"),
        lambda v: 2 if whole(v, 2, 2) else REFUSED,
        lambda s: s.parallel.tensor_parallel_size,
        (1, 2, 3, 4),
        also=("--rank", "--key_cache_shape"),
    ),
    Attribute(
        "--device_id",
        flag("device_id"),
        lambda v: v if whole(v, 0, 2**31 - 1) else REFUSED,
        lambda s: (s.device_id, s.local_device)[0],
        (0, 5, 2**31),
    ),
    Attribute(
        "--cache_dtype",
        flag("cache_dtype"),
        lambda v: CACHE_DTYPE_FLAG.get(v, REFUSED) if type(v) is str else REFUSED,
        lambda s: (s.cache.cache_dtype, s.cache.kv_cache_quant_type),
        ("bfloat16", "uint8", "block_wise_fp8", "int8", "int4_zp", "float16", "UINT8"),
        also=("quantization_config.kv_cache_quant_type",),
    ),
    Attribute(
        "--key_cache_shape",
        flag("key_cache_shape"),
        lambda v: 900 if ascii_numbers(v, 0, 2**63) == [900, 2, 64, 128] else REFUSED,
        lambda s: s.num_blocks,
        ("900,2,64,128", " 900, 2,64,128", "1,2,64,128", "900,2,32,128", "900,2,64,64", "900,2,64"),
        also=("--value_cache_shape",),
    ),
    Attribute(
        "--value_cache_shape",
        flag("value_cache_shape"),
        lambda v: (900, 2, 64, 128) if ascii_numbers(v, 0, 2**63) == [900, 2, 64, 128] else REFUSED,
        lambda s: s.tensor_specs[1].shape,
        ("900,2,64,128", "", "900,2,64,64", "900,2,64,128,1"),
    ),
    Attribute(
        "--engine_worker_queue_port",
        flag("engine_worker_queue_port"),
        lambda v: str(v) if whole(v, 1, 65535) else REFUSED,
        lambda s: s.suffix,
        (1, 8002, 65535, 65536),
    ),
    Attribute(
        "--num_cpu_blocks",
        flag("num_cpu_blocks"),
        lambda v: v if whole(v, 0, 2**63 - 1) else REFUSED,
        lambda s: s.cache.num_cpu_blocks,
        (0, 85, 2**63),
    ),
    Attribute(
        "--kvcache_storage_backend",
        flag("kvcache_storage_backend"),
        lambda v: v if v is None or (type(v) is str and v in BACKENDS) else REFUSED,
        lambda s: s.cache.kvcache_storage_backend,
        (None, *BACKENDS, "none"),
    ),
    Attribute(
        "--splitwise_role",
        flag("splitwise_role"),
        lambda v: v if type(v) is str and v in ROLES else REFUSED,
        lambda s: s.splitwise_role,
        (*ROLES, "Decode"),
    ),
    Attribute(
        "--speculative_config",
        flag("speculative_config"),
        dict_speculative,
        cache_of,
        (
            {},
            {"method": "mtp"},
            {"method": "MTP", "num_extra_cache_layer": 1},
            {"method": "mtp", "num_extra_cache_layer": 0},
            {"num_gpu_block_expand_ratio": 0.5},
            '{"method": "mtp"}',
        ),
        also=tuple(f"--speculative_config.{key}" for key in SPEC_KEYS),
    ),
    *(
        Attribute(
            f"--speculative_config.{key}",
            spec_key(key),
            lambda v, key=key: dict_speculative({key: v}),
            cache_of,
            values,
        )
        for key, values in SPEC_KEYS.items()
    ),
    Attribute(
        "--model_path",
        flag("model_path"),
        lambda v: "qwen3-30b-a3b" if v in (QWEN, QWEN + "/") else REFUSED,
        lambda s: s.model.name,
        (QWEN, QWEN + "/", "examples", ""),
        also=("model_path",),
    ),  # None: pass it
    Attribute(
        "--ipc_suffix",
        flag("ipc_suffix"),
        lambda v: (
            v if v is None or (isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", v)) else REFUSED
        ),
        lambda s: s.block_count_suffix,
        (None, "4242", "a_b-c", "-x", "../x", "x" * 65),
    ),
    Attribute(
        "--engine_pid",
        flag("engine_pid"),
        lambda v: "4242" if v is None else str(v) if whole(v, 1, 2**31 - 1) else REFUSED,
        lambda s: s.block_count_suffix,
        (None, 4242, 0, "4242"),
    ),
    Attribute(
        "--num_layers",
        flag("num_layers"),
        lambda v: 48 if v is None or whole(v, 48, 48) else REFUSED,
        lambda s: s.model.num_hidden_layers,
        (None, 48, 47),
    ),
    Attribute(
        "--default_dtype",
        flag("default_dtype"),
        lambda v: v if type(v) is str and v in ("bfloat16", "float16") else REFUSED,
        lambda s: s.tensor_specs[2].dtype,
        ("bfloat16", "float16", "uint8", "int8", "float32"),
    ),
)
"""The cache transfer manager's flags (the --default_dtype case on a block_wise_fp8 cache, which has scales)."""

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.sampled_from([0, -1, 2**31, 2**63, 10**400, 8002.0, 8002.9, 0.5, math.nan, math.inf, -math.inf]),
    st.text(max_size=10),
    st.sampled_from(
        [
            "",
            " ",
            "abc",
            "2",
            "8002",
            "8002,8003",
            "\u00b2",
            "\u0663",
            "0,\u00b2",
            "4,\u0663",
            "-1",
            "1e+30",
            "../x",
            " 8002 ",
            "0x10",
            "1_000",
            "nan",
            "None",
        ]
    ),
    st.lists(st.integers(min_value=-5, max_value=70_000), max_size=3),
    st.tuples(st.just(8002)),
    st.builds(SimpleNamespace),
    st.builds(object),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
"""FastDeploy-shaped values of every kind: None, bools, ints (negative, huge), floats (NaN, inf, whole, not), text
(non-ASCII digits, lists, numbers in other forms), lists, objects, dicts."""


def engine_calls_accept(settings: FastDeploySettings, cpu: Platform) -> None:
    """What every engine call checks of the settings it is given, before any hook runs."""
    check_suffix(settings.suffix)
    if settings.block_count_suffix is not None:
        check_suffix(settings.block_count_suffix, "block_count_suffix")
    DecisionInputs(
        False, settings.cache.num_cpu_blocks, settings.cache.kvcache_storage_backend, settings.splitwise_role
    )
    layout = settings.layout()
    # a cache process's own blocks; a runner's are its plan's, which gives the draft at least one block where any
    # count can; a ratio so small that none can is refused naming it, as the planner refuses it (a subnormal ratio's
    # inverse is inf, bounded before it is rounded)
    blocks = settings.num_blocks or max(16, math.ceil(min(1 / layout.mtp_block_ratio, 2**40)))
    for part in (layout.main(), layout.draft()) if layout.mtp_layers else (layout,):
        if part.part == "draft" and part.mtp_blocks(blocks) < 1:
            with pytest.raises(ConfigError, match="num_gpu_block_expand_ratio"):
                cpu.cache_layout(part, blocks, settings.tensor_specs)
            continue
        cpu.cache_layout(part, blocks, settings.tensor_specs)


def check_read_or_refused(
    read: Callable[[], FastDeploySettings], attribute: Attribute, value: object, cpu: Platform
) -> None:
    expected = attribute.meaning(value)
    try:
        settings = read()
    except ConfigError as error:
        assert error.field in (attribute.name, *attribute.also), (value, str(error))
        assert expected is REFUSED, (value, str(error))
        return
    assert expected is not REFUSED, (value, "accepted", attribute.read(settings))
    assert attribute.read(settings) == expected, value
    engine_calls_accept(settings, cpu)


def test_a_cache_process_ratio_that_leaves_the_draft_no_block_is_refused_naming_its_flag() -> None:
    """int(16 x 0.03125) is 0 draft blocks: refused where the command line is read, naming the flag, not later by an
    engine call as a zero-length tensor shape."""
    mtp = {"method": "mtp", "num_gpu_block_expand_ratio": 0.03125, "num_extra_cache_layer": 1}
    args = manager_args(speculative_config=mtp, key_cache_shape="16,2,64,128", value_cache_shape="16,2,64,128")
    with pytest.raises(ConfigError) as refusal:
        from_cache_manager_args(args)
    assert refusal.value.field == "--speculative_config.num_gpu_block_expand_ratio"
    assert "int(16 x 0.03125) is 0" in str(refusal.value)
    assert from_cache_manager_args(
        manager_args(
            speculative_config={**mtp, "num_gpu_block_expand_ratio": 0.0625},
            key_cache_shape="16,2,64,128",
            value_cache_shape="16,2,64,128",
        )
    )


def test_a_runners_draft_shaped_for_too_few_blocks_is_refused_naming_the_ratio(cpu: Platform) -> None:
    """A runner's plan gives the draft at least one block; an engine call given fewer blocks is refused naming the
    ratio (ConfigError), not a record's zero-length shape."""
    settings = from_fd_config(fd_config(QWEN, tp=2, port="8002,8012", mtp=True), local_rank=1)
    draft = replace(settings.cache, num_gpu_block_expand_ratio=0.03125)
    layout = replace(settings, cache=draft).layout().draft()
    with pytest.raises(ConfigError) as refusal:
        cpu.cache_layout(layout, 16)
    assert refusal.value.field == "num_gpu_block_expand_ratio"


def check_fd_attribute(attribute: Attribute, value: object, cpu: Platform) -> None:
    """``value`` put in ``attribute`` of rank 1's worker FDConfig: read as FastDeploy means it, or refused naming it."""
    config = fd_config(QWEN, tp=2, port="8002,8012", mtp=attribute.mtp)
    attribute.put(config, value)
    check_read_or_refused(lambda: from_fd_config(config, local_rank=1), attribute, value, cpu)


@pytest.mark.parametrize("ratio", [0.03125, 1e-300])
def test_a_tiny_speculative_ratio_is_read_as_fastdeploy_means_it(cpu: Platform, ratio: float) -> None:
    """The property test's two draws that found the draft's zero blocks: a runner's plan gives the draft a block
    where a count can; where none can (1e-300), the engine call refuses naming the ratio."""
    attribute = next(a for a in FD_ATTRIBUTES if a.name.endswith(".num_gpu_block_expand_ratio"))
    check_fd_attribute(attribute, ratio, cpu)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_every_fd_config_attribute_is_read_as_fastdeploy_means_it_or_refused_naming_it(
    cpu: Platform, data: st.DataObject
) -> None:
    attribute = data.draw(st.sampled_from(FD_ATTRIBUTES), label="attribute")
    value = data.draw(st.one_of(st.sampled_from(attribute.good), ODD_VALUES), label="value")
    check_fd_attribute(attribute, value, cpu)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_every_cache_manager_flag_is_read_as_fastdeploy_means_it_or_refused_naming_it(
    cpu: Platform, data: st.DataObject
) -> None:
    attribute = data.draw(st.sampled_from(CLI_ATTRIBUTES), label="flag")
    value = data.draw(st.one_of(st.sampled_from(attribute.good), ODD_VALUES), label="value")
    args = manager_args(**({"cache_dtype": "block_wise_fp8"} if attribute.name == "--default_dtype" else {}))
    attribute.put(args, value)
    check_read_or_refused(lambda: from_cache_manager_args(args), attribute, value, cpu)


def test_a_transfer_manager_launched_to_create_beside_a_rule_whose_worker_creates_is_refused_naming_the_flag() -> None:
    """A storage backend in a mixed instance: FastDeploy before PR #8046 launches its transfer manager with
    --create_cache_tensor (prefix_cache_manager.py ~L299-301), since #8046 without; under rule 2026-06 the worker
    creates, so the flag says the cache would be allocated twice."""
    launched = manager_args(kvcache_storage_backend="file", num_cpu_blocks=0, create_cache_tensor=True)
    attaching = manager_args(kvcache_storage_backend="file", num_cpu_blocks=0, create_cache_tensor=False)
    with pytest.raises(ConfigError) as caught:
        from_cache_manager_args(launched, rule="2026-06")
    assert caught.value.field == "--create_cache_tensor" and "allocated twice" in str(caught.value)
    assert from_cache_manager_args(launched, rule="2026-04").rule == "2026-04"  # its own FastDeploy's rule
    assert from_cache_manager_args(attaching, rule="2026-06").rule == "2026-06"
    assert from_cache_manager_args(launched).rule is None  # unpinned: the request refuses it, naming every version
