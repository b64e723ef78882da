"""What FastDeploy's own helper module did, now fd_platforms.fastdeploy's: our platform for its ``current_platform``,
its attention backend's shapes as our tensor specs, its profiled budget as a plan, the bytes of N blocks for its
profile add-back, the MTP proposer's settings from the runner's, the views its cache processes keep, the rule pin.
Each is checked against what FastDeploy does (the stand-ins cite where) and against the layout the engine plans."""

from __future__ import annotations

import fastdeploy_runner_standin as fastdeploy
import pytest
from fastdeploy_config_standin import fd_config, proposer_fd_config

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import CacheRoleShape
from fd_platforms.engine import allocate_kv_cache
from fd_platforms.fastdeploy import (
    FASTDEPLOY_PLATFORMS,
    FASTDEPLOY_RULE,
    ProfiledBudget,
    backend_tensor_specs,
    from_fd_config,
    messager_cache_kvs,
    num_blocks_for,
    our_platform,
    our_platform_name,
    plan_from_profile,
    profile_cache_bytes,
    proposer_settings,
    tensor_specs_from_shapes,
    transfer_manager_views,
)
from fd_platforms.rules.decision import RULE_VERSIONS
from fd_platforms.rules.shapes import engine_shaped

QWEN, DEEPSEEK, DEEPSEEK_32 = "examples/qwen3-30b-a3b", "examples/deepseek-v3", "examples/deepseek-v3.2"


def settings(model: str = QWEN, **config: object):
    return from_fd_config(fd_config(model, **config), local_rank=0, rule=FASTDEPLOY_RULE)  # type: ignore[arg-type]


# --- our platform for FastDeploy's current_platform ------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_name", "ours"),
    [
        ("gpu", "cuda"),
        ("metax_gpu", "metax"),
        ("iluvatar_gpu", "iluvatar"),
        ("xpu", "xpu"),
        ("dcu", "dcu"),
        ("gcu", "gcu"),
        ("intel_hpu", "intel_hpu"),
        ("npu", "npu"),
        ("cpu", "cpu"),
    ],
)
def test_each_of_fastdeploys_platforms_names_ours(device_name: str, ours: str) -> None:
    """By the ``device_name`` each of FastDeploy's platform classes sets (``fastdeploy/platforms/*.py``): MetaX's
    class is ``MACAPlatform`` but names itself ``metax_gpu``."""
    platform = type("FastDeploysPlatform", (), {"device_name": device_name})()
    assert our_platform_name(platform) == ours
    assert set(FASTDEPLOY_PLATFORMS) == {
        "gpu",
        "metax_gpu",
        "iluvatar_gpu",
        "xpu",
        "dcu",
        "gcu",
        "intel_hpu",
        "npu",
        "cpu",
    }


@pytest.mark.parametrize(
    "platform", [object(), type("P", (), {"device_name": "tpu"})(), type("P", (), {"device_name": 3})()]
)
def test_an_unknown_platform_is_a_config_error_naming_device_name(platform: object) -> None:
    with pytest.raises(ConfigError) as raised:
        our_platform_name(platform)
    assert raised.value.field == "current_platform.device_name"
    assert "metax_gpu" in raised.value.allowed and "FD_PLATFORM" in raised.value.fix


def test_fastdeploys_cpu_platform_selects_ours_once_and_fd_platform_naming_another_is_refused() -> None:
    platform = our_platform(fastdeploy.CPUPlatform(), environ={})
    assert platform.name == "cpu" and our_platform(fastdeploy.CPUPlatform(), environ={}) is platform
    assert our_platform(fastdeploy.CPUPlatform(), environ={"FD_PLATFORM": "cpu"}) is platform
    with pytest.raises(ConfigError) as raised:
        our_platform(fastdeploy.MACAPlatform(), environ={"FD_PLATFORM": "cuda"})
    assert raised.value.field == "FD_PLATFORM" and "'metax'" in raised.value.allowed


# --- the backend's shapes as tensor specs ------------------------------------------------------------------------


def specs_for(model: str, backend: object, blocks: int = 5, **config: object) -> tuple[CacheRoleShape, ...]:
    kv = settings(model, **config)
    specs = backend_tensor_specs(backend, blocks, kv)
    engine_shaped(kv.layout().main(), specs, blocks)  # what the engine call checks: the plan's bytes, role by role
    return specs


def gqa_backend(**config: object) -> fastdeploy.AppendAttentionBackend:
    return fastdeploy.attention_backend(fd_config(QWEN, **config))  # type: ignore[arg-type]


def test_gqa_key_and_value_in_the_model_dtype_and_uint8_once_quantized() -> None:
    """``gpu_model_runner.py`` ``initialize_kv_cache``: the model's dtype, ``uint8`` whenever quantized."""
    assert specs_for(QWEN, gqa_backend()) == (
        CacheRoleShape("key", (5, 4, 64, 128), "bfloat16"),
        CacheRoleShape("value", (5, 4, 64, 128), "bfloat16"),
    )
    assert {spec.dtype for spec in specs_for(QWEN, gqa_backend(), kv_cache_quant_type="int8")} == {"uint8"}


def test_block_wise_fp8_adds_a_scale_of_the_keys_first_three_axes_per_key_and_value() -> None:
    specs = specs_for(QWEN, gqa_backend(), kv_cache_quant_type="block_wise_fp8")
    assert [(spec.role, spec.shape, spec.dtype) for spec in specs] == [
        ("key", (5, 4, 64, 128), "uint8"),
        ("value", (5, 4, 64, 128), "uint8"),
        ("key_scale", (5, 4, 64), "bfloat16"),
        ("value_scale", (5, 4, 64), "bfloat16"),
    ]


def test_int4_zp_is_the_gpu_backends_halved_key() -> None:
    specs = specs_for(QWEN, gqa_backend(), kv_cache_quant_type="int4_zp")
    assert [spec.shape for spec in specs] == [(5, 4, 64, 64), (5, 4, 64, 64)] and specs[0].dtype == "uint8"


def test_mla_is_its_key_alone_and_block_wise_fp8_its_key_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_ATTENTION_BACKEND", "MLA_ATTN")
    backend = fastdeploy.attention_backend(fd_config(DEEPSEEK))
    assert specs_for(DEEPSEEK, backend) == (CacheRoleShape("key", (5, 1, 64, 576), "bfloat16"),)
    specs = specs_for(DEEPSEEK, backend, kv_cache_quant_type="block_wise_fp8")
    assert [(spec.role, spec.shape) for spec in specs] == [("key", (5, 1, 64, 576)), ("key_scale", (5, 1, 64))]


def test_dsa_is_a_uint8_key_and_indexer_asked_with_its_uint8_quantization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FD_ATTENTION_BACKEND", "DSA_ATTN")
    asked = []

    class Recording(fastdeploy.DSAAttentionBackend):
        def get_kv_cache_shape(self, max_num_blocks: int, kv_cache_quant_type: str | None = None):  # type: ignore[override]
            asked.append(kv_cache_quant_type)
            return super().get_kv_cache_shape(max_num_blocks, kv_cache_quant_type)

    model = fd_config(DEEPSEEK_32).model_config
    specs = specs_for(DEEPSEEK_32, Recording(64, model.kv_lora_rank, model.qk_rope_head_dim, model.index_head_dim))
    assert asked == ["uint8"]
    assert [(spec.role, spec.shape, spec.dtype) for spec in specs] == [
        ("key", (5, 1, 64, 656), "uint8"),
        ("indexer", (5, 64, 132), "uint8"),
    ]


def test_the_xpu_runners_int8_is_its_cache_type() -> None:
    backend = fastdeploy.attention_backend(fd_config(QWEN), xpu=True)
    kv = settings(QWEN, kv_cache_quant_type="int8")
    specs = backend_tensor_specs(backend, 5, kv, cache_type="int8")
    engine_shaped(kv.layout(), specs, 5)
    assert {spec.dtype for spec in specs} == {"int8"} and specs[0].shape == (5, 4, 64, 128)


@pytest.mark.parametrize(
    "answer",
    [None, ([5, 4, 64, 128],), ([], []), ([5, 4, 0, 128], [5, 4, 64, 128]), ("5,4", "5,4"), [[5], [5], [5], [5]]],
)
def test_an_answer_that_is_not_the_backends_shapes_is_a_config_error(answer: object) -> None:
    with pytest.raises(ConfigError) as raised:
        tensor_specs_from_shapes(answer, settings())
    assert raised.value.field.startswith("get_kv_cache_shape")


def test_an_object_without_get_kv_cache_shape_is_refused_naming_the_backend() -> None:
    with pytest.raises(ConfigError) as raised:
        backend_tensor_specs(object(), 5, settings())
    assert raised.value.field == "backend"


# --- the profiled budget as a plan, and the bytes of the profile add-back ----------------------------------------


def test_fastdeploys_budget_and_ours_agree_and_the_add_back_is_device_bytes() -> None:
    """``gpu_worker.py`` ``determine_available_memory`` then ``worker_process.py``'s ``available // per_block``."""
    kv = settings()
    platform = our_platform(fastdeploy.CPUPlatform(), environ={})
    total, used, activations, profile_blocks = 8 << 30, 1 << 30, 300 << 20, 100
    assert profile_cache_bytes(kv, profile_blocks) == kv.layout().device_bytes(profile_blocks) == 100 * 48 * 131072
    peak = profile_cache_bytes(kv, profile_blocks) + activations
    budget = ProfiledBudget(total, used, peak, profile_blocks)
    fastdeploys = total * 0.9 - used - peak + profile_cache_bytes(kv, profile_blocks)
    assert plan_from_profile(platform, kv, budget).num_blocks == int(fastdeploys // kv.layout().bytes_per_block)


def test_with_mtp_ratio_2_the_plan_counts_the_draft_blocks_exactly() -> None:
    config = fd_config(QWEN, mtp=True)
    config.speculative_config.num_gpu_block_expand_ratio = 2
    kv = from_fd_config(config, local_rank=0, rule=FASTDEPLOY_RULE)
    layout, platform = kv.layout(), our_platform(fastdeploy.CPUPlatform(), environ={})
    assert profile_cache_bytes(kv, 10) == 131072 * (48 * 10 + 1 * 20)
    plan = plan_from_profile(platform, kv, ProfiledBudget(1 << 30, 0, profile_cache_bytes(kv, 10), 10))
    assert layout.device_bytes(plan.num_blocks) <= int((1 << 30) * 0.9) < layout.device_bytes(plan.num_blocks + 1)


def test_a_peak_that_missed_the_profile_cache_and_bad_numbers_are_config_errors() -> None:
    kv, platform = settings(), our_platform(fastdeploy.CPUPlatform(), environ={})
    with pytest.raises(ConfigError) as raised:
        plan_from_profile(platform, kv, ProfiledBudget(1 << 30, 0, 0, 100))
    assert raised.value.field == "peak_increase_bytes"
    for bad in ({"total_bytes": 0}, {"used_bytes": 2 << 30}, {"peak_increase_bytes": -1}, {"profile_blocks": 1.5}):
        with pytest.raises(ConfigError) as raised:
            ProfiledBudget(
                **{"total_bytes": 1 << 30, "used_bytes": 0, "peak_increase_bytes": 0, "profile_blocks": 0, **bad}
            )  # type: ignore[arg-type]
        assert raised.value.field == next(iter(bad))
    with pytest.raises(ConfigError):
        plan_from_profile(platform, kv, 1 << 30)  # type: ignore[arg-type]


class _Worker:
    """A FastDeploy worker as ``worker_process.py`` holds it: ``model_runner`` and ``cal_theortical_kvcache``."""

    def __init__(self, runner: object, per_block: object) -> None:
        self.model_runner, self.per_block = runner, per_block

    def cal_theortical_kvcache(self) -> object:
        return self.per_block


class _PortedRunner:
    def __init__(self) -> None:
        self.kv, self.platform = settings(), our_platform(fastdeploy.CPUPlatform(), environ={})


def test_the_worker_process_plans_a_profiled_budget_and_divides_any_other_workers_bytes() -> None:
    """``worker_process.py`` ``initialize_kv_cache`` after the port: the ported GPU worker's ProfiledBudget is planned
    on its runner's platform; the XPU, DCU, Iluvatar, MetaX, GCU and HPU workers' bytes are divided by their
    ``cal_theortical_kvcache()``, as FastDeploy divides them (``int(available // per_block)``)."""
    runner = _PortedRunner()
    budget = ProfiledBudget(8 << 30, 1 << 30, profile_cache_bytes(runner.kv, 100) + (300 << 20), 100)
    worker = _Worker(runner, runner.kv.layout().bytes_per_block)
    assert num_blocks_for(worker, budget) == plan_from_profile(runner.platform, runner.kv, budget).num_blocks
    assert num_blocks_for(_Worker(None, 4096), 10 * 4096 + 4095) == 10  # an unported runner's own figure
    assert num_blocks_for(_Worker(None, 4096), float(3 * 4096)) == 3  # the XPU worker's float


@pytest.mark.parametrize(
    ("worker", "budget", "field"),
    [
        (_Worker(None, 4096), ProfiledBudget(1 << 30, 0, 0, 0), "worker.model_runner"),  # no ported runner
        (_Worker(None, 4096), "1GB", "available_kv_cache_memory"),
        (_Worker(None, 4096), float("nan"), "available_kv_cache_memory"),
        (_Worker(None, 4096), -1, "available_kv_cache_memory"),
        (_Worker(None, 4096), True, "available_kv_cache_memory"),
        (_Worker(None, 4096), 4095, "available_kv_cache_memory"),  # under one block: FastDeploy's ValueError
        (_Worker(None, 0), 1 << 30, "cal_theortical_kvcache()"),
        (_Worker(None, 1.5), 1 << 30, "cal_theortical_kvcache()"),
    ],
)
def test_a_budget_or_a_block_size_that_gives_no_count_is_a_config_error_naming_it(
    worker: _Worker, budget: object, field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        num_blocks_for(worker, budget)
    assert raised.value.field == field


# --- the proposer's settings from the runner's -----------------------------------------------------------------


def test_the_proposers_one_layer_copy_is_refused_and_its_settings_come_from_the_runners() -> None:
    runner_config = fd_config(QWEN, mtp=True)
    copy = proposer_fd_config(runner_config)
    with pytest.raises(ConfigError) as raised:
        from_fd_config(copy, local_rank=0)
    assert raised.value.field == "fd_config.speculative_config.model_type" and "proposer_settings" in raised.value.fix
    runner = from_fd_config(runner_config, local_rank=0, rule=FASTDEPLOY_RULE)
    proposer = proposer_settings(runner, copy)
    assert (
        proposer.layout() == runner.layout().draft() and proposer.layout().names()[0] == "key_caches_48_rank0.device0"
    )
    request = proposer.cache_request(16, profile=True, timeout=5)
    assert request == runner.cache_request(runner.layout().draft(), 16, profile=True, timeout=5)
    assert request.layout == proposer.layout() and request.instance == runner.suffix and request.profile


def test_a_proposer_copy_of_another_runner_or_a_runner_without_mtp_is_refused() -> None:
    runner = from_fd_config(fd_config(QWEN, mtp=True), local_rank=0)
    other = proposer_fd_config(fd_config(DEEPSEEK, mtp=True))
    with pytest.raises(ConfigError) as raised:
        proposer_settings(runner, other)
    assert raised.value.field == "proposer.fd_config.model_config.start_layer_index"
    with pytest.raises(ConfigError) as raised:
        proposer_settings(from_fd_config(fd_config(QWEN), local_rank=0))
    assert raised.value.field == "fd_config.speculative_config.method"
    with pytest.raises(ConfigError):
        proposer_settings(fd_config(QWEN, mtp=True))  # type: ignore[arg-type]  # the FDConfig, not the settings


# --- the views FastDeploy's cache processes keep ------------------------------------------------------------


def test_the_messagers_keys_have_an_underscore_where_the_ipc_name_has_a_dot() -> None:
    """``cache_messager.py`` ``CacheMessager.__init__`` reads ``key_caches_{layer}_rank{rank}_device{id}``."""
    layout = settings().layout()
    cache = allocate_kv_cache(layout, 2, "cpu")
    keys = messager_cache_kvs(cache)
    assert list(keys)[:2] == ["key_caches_0_rank0_device0", "value_caches_0_rank0_device0"]
    assert list(keys.values()) == cache.tensors
    for views in (messager_cache_kvs, transfer_manager_views):
        with pytest.raises(ConfigError):
            views(object())


# --- the stand-in FDConfig, as FastDeploy's worker builds it ---------------------------------------------------


def test_a_text_config_model_reads_as_fastdeploys_model_config_flattens_it() -> None:
    """``ModelConfig.__init__`` sets ``text_config``'s keys as attributes (no ``text_config`` attribute stays)."""
    config = fd_config("examples/gemma-3-27b")
    assert not hasattr(config.model_config, "text_config") and config.model_config.num_hidden_layers == 62
    layout = from_fd_config(config, local_rank=0).layout()
    assert (layout.num_layers, layout.kv_heads, layout.head_dim) == (62, 16, 128)


def test_the_workers_ranks_come_from_its_global_local_rank() -> None:
    """``worker_process.py`` ``initialize_fd_config``: tp rank, dp rank and, with dp, the node's dp id."""
    parallel = fd_config(QWEN, tp=2, dp=4, local_rank=5, port="8002,8003,8004,8005").parallel_config
    assert (parallel.tensor_parallel_rank, parallel.data_parallel_rank, parallel.local_data_parallel_id) == (1, 2, 2)


# --- the rule pin -------------------------------------------------------------------------------------------------


def test_the_rule_pin_is_the_version_fastdeploy_follows_since_pr_7471() -> None:
    assert FASTDEPLOY_RULE in RULE_VERSIONS and "7471" in RULE_VERSIONS[FASTDEPLOY_RULE].fastdeploy


def test_on_xpu_the_proposers_draft_part_is_int8_as_its_get_cache_type_answers() -> None:
    """``mtp.py`` ``_get_cache_type``: an 8-bit draft cache is ``uint8`` on CUDA and ``int8`` on XPU. The ported
    proposer passes no ``tensor_specs`` on XPU, so the xpu plugin shapes the draft part as it shapes the runner's."""
    from fd_platforms.loading.discovery import discover
    from fd_platforms.loading.platform import load_platform

    config = fd_config(QWEN, mtp=True)
    config.quant_config = type("QuantConfig", (), {"kv_cache_quant_type": "int8"})()
    draft = proposer_settings(from_fd_config(config, local_rank=0, rule=FASTDEPLOY_RULE), proposer_fd_config(config))
    whole = draft.runner.layout()
    assert whole.draft().num_layers == 1
    shaped = {name: load_platform(discover()[name][0]).cache_layout(whole.draft(), 5) for name in ("xpu", "cuda")}
    assert {role.dtype for role in shaped["xpu"].allocated_roles} == {"int8"}
    assert {role.dtype for role in shaped["cuda"].allocated_roles} == {"uint8"}
