"""MTP layers' device blocks: int(num_blocks * num_gpu_block_expand_ratio), planned so main + MTP bytes fit exactly."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from run_helpers import ROOT, SCRIPT, clean_env, main_on_cpu

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import DeviceMemory, PlatformLimit
from fd_platforms.engine import allocate_kv_cache
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_deploy_config, load_model_config
from fd_platforms.rules.layout import build_layout
from fd_platforms.rules.planner import plan_blocks

DEEPSEEK = f"{ROOT}/examples/deepseek-v3"  # 61 hidden layers + 1 MTP layer, MLA


def layout_with(ratio: float, **cache: object):
    model = load_model_config(DEEPSEEK, use_mtp=True)
    config = CacheConfig(num_gpu_block_expand_ratio=ratio, **cache)
    return build_layout(model, config, ParallelConfig()), config


@pytest.mark.parametrize("ratio", [1.0, 2.0, 1.3, 0.5, 3.7])
def test_the_plan_is_the_floor_of_main_plus_mtp_bytes(ratio: float) -> None:
    layout, cache = layout_with(ratio)
    memory = DeviceMemory(80 * 2**30, None, None, "test")
    plan = plan_blocks(layout, memory, cache)
    n, per_layer = plan.num_blocks, layout.layer_bytes_per_block
    assert layout.mtp_layers == 1 and layout.num_layers == 62
    device = per_layer * (61 * n + 1 * int(n * ratio))
    assert layout.device_bytes(n) == device <= plan.budget_bytes  # fits
    assert layout.device_bytes(n + 1) > plan.budget_bytes  # and nothing beyond one block's rounding is left
    if ratio == 1.0:
        assert n == plan.budget_bytes // layout.bytes_per_block  # the plain floor, as before


def test_mtp_tensors_hold_the_expanded_blocks_and_the_rest_the_plan() -> None:
    layout, _ = layout_with(2.0, block_size=16)
    kv = allocate_kv_cache(layout, 3, "cpu")
    try:
        shapes = {spec.layer: tuple(tensor.shape) for spec, tensor in zip(layout.tensors, kv.tensors, strict=True)}
        assert shapes[0] == shapes[60] == (3, 1, 16, 576) and shapes[61] == (6, 1, 16, 576)
        assert kv.nbytes == layout.device_bytes(3) == layout.layer_bytes_per_block * (61 * 3 + 6)
    finally:
        kv.clear()


def test_the_host_swap_copy_of_an_mtp_layer_has_the_plans_cpu_blocks() -> None:
    layout, _ = layout_with(2.0)
    spec = layout.tensors[-1]
    assert spec.block_ratio == 2.0 and spec.shape(4)[0] == 8 and spec.host_shape(4)[0] == 4


def test_a_tensor_element_limit_counts_the_larger_mtp_tensor() -> None:
    layout, cache = layout_with(2.0)
    limit = PlatformLimit("max_tensor_elements", 2**20, "int32 offsets in a test kernel")
    plan = plan_blocks(layout, DeviceMemory(80 * 2**30, None, None, "test"), cache, limits=(limit,))
    per_block = 64 * 576  # one block of the latent cache
    assert plan.binding == "platform_limit" and plan.num_blocks == (2**20 // per_block) // 2
    assert (
        layout.largest_tensor_elements(plan.num_blocks) <= 2**20 < layout.largest_tensor_elements(plan.num_blocks + 1)
    )


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, 65.0, "2", True])
def test_a_bad_ratio_is_a_config_error_naming_it(value: object) -> None:
    with pytest.raises(ConfigError, match="num_gpu_block_expand_ratio") as info:
        CacheConfig(num_gpu_block_expand_ratio=value)  # type: ignore[arg-type]
    assert "allowed: a number greater than 0 and at most 64 (not a bool or text)" in str(info.value)
    assert "Fix: give the MTP layers' device blocks as a multiple of the main layers'" in str(info.value)


def test_a_ratio_rounding_the_mtp_blocks_to_none_is_refused() -> None:
    layout, cache = layout_with(0.01, num_gpu_blocks_override=50)
    with pytest.raises(ConfigError, match=r"int\(50 x 0.01\) is 0") as info:
        plan_blocks(layout, DeviceMemory(80 * 2**30, None, None, "test"), cache)
    assert str(info.value).startswith("num_gpu_block_expand_ratio=0.01 is not valid")
    assert "Fix: raise num_gpu_block_expand_ratio" in str(info.value)


def test_the_toml_takes_the_ratio(tmp_path) -> None:
    toml = tmp_path / "deploy.toml"
    toml.write_text(f'[model]\npath = "{DEEPSEEK}"\nuse_mtp = true\n[cache]\nnum_gpu_block_expand_ratio = 1.5\n')
    assert load_deploy_config(toml).cache.num_gpu_block_expand_ratio == 1.5


def test_plan_json_shows_both_counts() -> None:
    done = main_on_cpu(
        "plan", "--model", DEEPSEEK, "--mtp", "--num-gpu-block-expand-ratio", "2", "--device-memory", "80GiB", "--json"
    )
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["mtp_layers"] == 1 and row["mtp_num_blocks"] == 2 * row["num_blocks"]
    assert row["device_cache_bytes"] <= row["budget_bytes"]
    assert "1 MTP layer(s) holding int(num_blocks x 2) each" in row["binding_reason"]


@pytest.mark.slow
def test_a_run_allocates_and_shares_the_mtp_blocks() -> None:
    done = subprocess.run(
        [
            SCRIPT,
            "run",
            "--model",
            DEEPSEEK,
            "--mtp",
            "--num-gpu-block-expand-ratio",
            "2",
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--role",
            "decode",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    layout, _ = layout_with(2.0)
    for rank in report["ranks"]:
        assert report["mtp_num_blocks"] == 2 * rank["num_blocks"]
        assert rank["device_bytes"] == layout.device_bytes(rank["num_blocks"]) and rank["verified"]
    table = subprocess.run(
        [
            SCRIPT,
            "run",
            "--model",
            DEEPSEEK,
            "--mtp",
            "--num-gpu-block-expand-ratio",
            "2",
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--role",
            "decode",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=clean_env(),
    )
    assert f"MTP layers {report['mtp_num_blocks']} blocks each" in table.stdout.splitlines()[0]
