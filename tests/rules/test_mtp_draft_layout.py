"""The MTP draft layers as their own layout part, as FastDeploy's proposer allocates them, in the one plan.

FastDeploy (``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``, the newest stored version):
the proposer numbers its layers from ``num_main_model_layers`` (``start_layer_index``), names them
``key_caches_{i}_rank{local_rank}.device{device_id}`` / ``value_caches_...`` (and with block_wise_fp8
``key_cache_scales_...`` / ``value_cache_scales_...``), and gives each ``int(main_model_num_blocks *
num_gpu_block_expand_ratio)`` blocks; its cache transfer manager (``cache_manager/cache_transfer_manager.py``
``_init_gpu_cache``) loops over ``num_layers + num_extra_layers`` with the same names and
``num_extra_layer_gpu_blocks`` for the extra layers.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from run_helpers import ROOT

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.config.model import ModelConfig
from fd_platforms.rules.layout import build_draft_layout, build_layout
from fd_platforms.rules.planner import plan_blocks, plan_violations

DEEPSEEK = f"{ROOT}/examples/deepseek-v3"  # 61 hidden layers + 1 MTP layer, MLA
GQA_MTP = ModelConfig(
    "gqa-mtp",
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_nextn_predict_layers=1,
    use_mtp=True,
)
MEMORY = DeviceMemory(80 * 2**30, None, None, "test")


def fastdeploy_draft_names(main_layers: int, draft_layers: int, rank: int, device: int, scales: bool) -> list[str]:
    """The names FastDeploy's proposer gives its draft tensors, layer by layer (mtp.py, initialize_kv_cache)."""
    roles = ["key_caches", "value_caches", *(["key_cache_scales", "value_cache_scales"] if scales else [])]
    return [
        f"{role}_{layer}_rank{rank}.device{device}"
        for layer in range(main_layers, main_layers + draft_layers)
        for role in roles
    ]


def test_the_draft_layout_names_its_layers_after_the_main_models_as_fastdeploy() -> None:
    cache = CacheConfig(kv_cache_quant_type="block_wise_fp8", cache_dtype="fp8")
    draft = build_draft_layout(GQA_MTP, cache, ParallelConfig(tensor_parallel_size=2, local_rank=1), device_id=5)
    assert list(draft.names()) == fastdeploy_draft_names(4, 1, rank=1, device=5, scales=True)
    assert draft.part == "draft" and draft.first_layer == 4 and draft.num_layers == 1


@pytest.mark.parametrize("ratio", [1.0, 2.0, 1.3, 0.5])
def test_the_draft_tensors_hold_fastdeploys_expanded_blocks(ratio: float) -> None:
    model = load_model_config(DEEPSEEK)
    draft = build_draft_layout(model, CacheConfig(num_gpu_block_expand_ratio=ratio), ParallelConfig())
    # MLA: FastDeploy's value_caches_61_... is a placeholder of shape [] that holds no block (see rules/layout.py)
    keys = [name for name in fastdeploy_draft_names(61, 1, rank=0, device=0, scales=False) if name.startswith("key")]
    assert [spec.name for spec in draft.tensors] == keys
    for num_blocks in (7, 100, 1001):
        assert {spec.shape(num_blocks)[0] for spec in draft.tensors} == {int(num_blocks * ratio)}
        assert draft.device_bytes(num_blocks) == draft.layer_bytes_per_block * int(num_blocks * ratio)


def test_main_and_draft_together_are_the_whole_layout() -> None:
    whole = build_layout(
        load_model_config(DEEPSEEK, use_mtp=True), CacheConfig(num_gpu_block_expand_ratio=2.0), ParallelConfig()
    )
    main, draft = whole.main(), whole.draft()
    assert main.part == "main" and main.num_layers == 61 and main.mtp_layers == 0
    assert main.names() + draft.names() == whole.names()
    assert main.host_names() + draft.host_names() == whole.host_names()
    assert main.bytes_per_block + draft.bytes_per_block == whole.bytes_per_block
    assert main.device_bytes(9) + draft.device_bytes(9) == whole.device_bytes(9)


def test_a_layout_without_mtp_is_its_own_main_and_has_no_draft() -> None:
    layout = build_layout(replace(GQA_MTP, use_mtp=False), CacheConfig(), ParallelConfig())
    assert layout.main() is layout
    with pytest.raises(ConfigError, match="use_mtp=False is not valid") as info:
        layout.draft()
    assert "Fix: build the layout from a model config with use_mtp=True" in str(info.value)
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        build_draft_layout(replace(GQA_MTP, num_nextn_predict_layers=0), CacheConfig(), ParallelConfig())


def test_only_a_whole_layout_splits_into_parts() -> None:
    draft = build_draft_layout(GQA_MTP, CacheConfig(), ParallelConfig())
    with pytest.raises(ConfigError, match=re.escape("layout.part='draft' is not valid")) as info:
        draft.main()
    assert "Fix: take .main() of the rank's whole layout" in str(info.value)


@pytest.mark.parametrize("ratio", [1.0, 2.0, 1.3])
def test_the_plan_counts_main_and_draft_bytes_and_says_the_draft_blocks(ratio: float) -> None:
    cache = CacheConfig(num_gpu_block_expand_ratio=ratio)
    whole = build_layout(load_model_config(DEEPSEEK, use_mtp=True), cache, ParallelConfig())
    plan = plan_blocks(whole, MEMORY, cache)
    main, draft = whole.main(), whole.draft()
    assert plan.num_draft_blocks == int(plan.num_blocks * ratio) == draft.tensors[0].shape(plan.num_blocks)[0]
    device = main.device_bytes(plan.num_blocks) + draft.device_bytes(plan.num_blocks)
    assert device <= plan.budget_bytes < whole.device_bytes(plan.num_blocks + 1)
    assert plan.bytes_per_block == main.bytes_per_block + draft.bytes_per_block  # one source of bytes per block


def test_a_plan_without_draft_layers_has_no_draft_blocks() -> None:
    cache = CacheConfig()
    plan = plan_blocks(build_layout(replace(GQA_MTP, use_mtp=False), cache, ParallelConfig()), MEMORY, cache)
    assert plan.num_draft_blocks == 0


def test_a_plan_naming_other_draft_blocks_breaks_the_planners_invariants() -> None:
    cache = CacheConfig(num_gpu_block_expand_ratio=2.0)
    whole = build_layout(load_model_config(DEEPSEEK, use_mtp=True), cache, ParallelConfig())
    plan = plan_blocks(whole, MEMORY, cache)
    broken = plan_violations(replace(plan, num_draft_blocks=plan.num_blocks), whole, MEMORY, cache, (), None)
    assert broken == [f"num_draft_blocks={plan.num_blocks}, but the layout's draft layers hold {plan.num_draft_blocks}"]


@pytest.mark.parametrize(
    "other",
    [
        build_layout(GQA_MTP, CacheConfig(), ParallelConfig(tensor_parallel_size=2, local_rank=1)).draft(),
        build_layout(GQA_MTP, CacheConfig(num_gpu_block_expand_ratio=2.0), ParallelConfig()).draft(),
        "layer 4",
    ],
)
def test_only_the_same_ranks_draft_part_joins_a_main_part(other: object) -> None:
    main = build_layout(GQA_MTP, CacheConfig(), ParallelConfig()).main()
    allowed = r"allowed: the draft part of the same rank's layout as this one \(the main part of rank 0: layers 0-3"
    with pytest.raises(ConfigError, match=rf"^draft=.* is not valid; {allowed}, ratio 1\)") as info:
        main.joined(other)
    assert "Fix: pass whole.main() as the layout and whole.draft() as draft" in str(info.value)
    whole = build_layout(GQA_MTP, CacheConfig(), ParallelConfig())
    assert whole.main().joined(whole.draft()) == whole


def test_the_draft_layout_is_named_for_the_physical_device_and_lives_on_the_local_one() -> None:
    draft = build_draft_layout(
        GQA_MTP, CacheConfig(), ParallelConfig(tensor_parallel_size=2, local_rank=1), device_id=5, local_device=1
    )
    assert draft.names()[0] == "key_caches_4_rank1.device5" and draft.local_device == 1
