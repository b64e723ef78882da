"""Platform-owned cache shapes (plugin API 1.2): the platform states axes and dtypes, the core keeps the bytes."""

from __future__ import annotations

import json
import subprocess
from operator import itemgetter

import pytest
from run_helpers import QWEN, ROOT, SCRIPT, clean_env, host_sharing_plugin, main_in_process

from fd_platforms.contract.errors import ConfigError, PlatformDriftError, RecordError
from fd_platforms.contract.types import CacheRoleShape
from fd_platforms.loading.discovery import discover
from fd_platforms.loading.platform import load_platform
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import build_layout
from fd_platforms.rules.shapes import shape_cases, shape_request, shape_violations

LLAMA = "examples/llama-3.1-8b"


def plan_json(platform: str, *flags: str) -> dict:
    done = main_in_process(
        "plan", "--platform", platform, "--model", LLAMA, "--device-memory", "80GiB", "--json", *flags
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tensors(row: dict) -> dict[str, tuple[list[int], str]]:
    """role -> (shape with N for the blocks, dtype)."""
    return {t["role"]: (["N", *t["shape"][1:]], t["dtype"]) for t in row["layer_tensors"]}


@pytest.mark.parametrize(
    ("platform", "flags", "expected"),
    [
        ("metax", (), {"key": (["N", 64, 8, 128], "bfloat16"), "value": (["N", 64, 8, 128], "bfloat16")}),
        ("cuda", (), {"key": (["N", 8, 64, 128], "bfloat16"), "value": (["N", 8, 64, 128], "bfloat16")}),
        (
            "cuda",
            ("--kv-cache-quant-type", "int4_zp"),
            {"key": (["N", 8, 64, 64], "uint8"), "value": (["N", 8, 64, 64], "uint8")},
        ),
        (
            "metax",
            ("--kv-cache-quant-type", "int4_zp"),
            {"key": (["N", 8, 64, 64], "uint8"), "value": (["N", 8, 64, 64], "uint8")},
        ),
        (
            "cuda",
            ("--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8"),
            {
                "key": (["N", 8, 64, 128], "uint8"),
                "value": (["N", 8, 64, 128], "uint8"),
                "key_scale": (["N", 8, 64], "bfloat16"),
                "value_scale": (["N", 8, 64], "bfloat16"),
            },
        ),
        (
            "metax",
            ("--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8"),
            {
                "key": (["N", 64, 8, 128], "uint8"),
                "value": (["N", 64, 8, 128], "uint8"),
                "key_scale": (["N", 64, 8], "bfloat16"),
                "value_scale": (["N", 64, 8], "bfloat16"),
            },
        ),
        ("xpu", ("--cache-dtype", "int8"), {"key": (["N", 8, 64, 128], "int8"), "value": (["N", 8, 64, 128], "int8")}),
        ("xpu", ("--cache-dtype", "fp8"), {"key": (["N", 8, 64, 128], "int8"), "value": (["N", 8, 64, 128], "int8")}),
        (
            "cuda",
            ("--cache-dtype", "int8"),
            {"key": (["N", 8, 64, 128], "uint8"), "value": (["N", 8, 64, 128], "uint8")},
        ),
        (
            "xpu",
            ("--kv-cache-quant-type", "int4_zp"),
            {"key": (["N", 8, 64, 128], "int8"), "value": (["N", 8, 64, 128], "int8")},
        ),
        (
            "xpu",
            ("--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8"),
            {"key": (["N", 8, 64, 128], "int8"), "value": (["N", 8, 64, 128], "int8")},
        ),
    ],
)
def test_each_platform_shapes_llama_as_its_kernels_do(platform: str, flags: tuple[str, ...], expected: dict) -> None:
    names = dict(zip(flags[::2], flags[1::2], strict=False))
    cache = CacheConfig(
        cache_dtype=names.get("--cache-dtype", "bfloat16"),
        kv_cache_quant_type=names.get("--kv-cache-quant-type", "none"),
    )
    layout = build_layout(load_model_config(f"{ROOT}/{LLAMA}"), cache, ParallelConfig())
    shaped = load_platform(discover()[platform][0]).cache_layout(layout, 5)
    assert {r.role: (["N", *r.block_shape], r.dtype) for r in shaped.allocated_roles} == expected


@pytest.mark.parametrize(("platform", "flags"), [("metax", ()), ("cuda", ("--kv-cache-quant-type", "int4_zp"))])
def test_plan_json_lists_the_platforms_shapes(platform: str, flags: tuple[str, ...]) -> None:
    row = plan_json(platform, *flags)
    layout = build_layout(
        load_model_config(f"{ROOT}/{LLAMA}"),
        CacheConfig(kv_cache_quant_type=row["kv_cache_quant_type"]),
        ParallelConfig(),
    )
    shaped = load_platform(discover()[platform][0]).cache_layout(layout, row["num_blocks"])
    assert tensors(row) == {r.role: (["N", *r.block_shape], r.dtype) for r in shaped.allocated_roles}
    assert all(t["shape"][0] == row["num_blocks"] for t in row["layer_tensors"])


def test_the_platforms_plan_the_same_blocks_whatever_their_axes() -> None:
    rows = [
        plan_json(name, "--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8") for name in ("cuda", "metax")
    ]
    assert len({(row["num_blocks"], row["bytes_per_block"]) for row in rows}) == 1


def test_xpu_plans_block_wise_fp8_without_scales_as_its_runner_allocates_it() -> None:
    """FastDeploy's XPU runner allocates key and value alone, int8, for any quantization (``xpu_model_runner.py``
    ``initialize_kv_cache``): an int8 cache's blocks, not the GPU's with scales."""
    xpu = plan_json("xpu", "--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8")
    assert (xpu["num_blocks"], xpu["bytes_per_block"]) == itemgetter("num_blocks", "bytes_per_block")(
        plan_json("xpu", "--cache-dtype", "int8")
    )
    assert set(tensors(xpu)) == {"key", "value"}


def test_int4_zp_is_counted_exactly_half_a_byte_per_value() -> None:
    model = load_model_config(f"{ROOT}/{LLAMA}")
    plain = build_layout(model, CacheConfig(), ParallelConfig())
    packed = build_layout(model, CacheConfig(kv_cache_quant_type="int4_zp"), ParallelConfig())
    assert packed.bytes_per_block == 2 * 8 * 64 * (128 // 2) * 32 == plain.bytes_per_block // 4


def test_int4_zp_needs_an_even_head_dim_for_its_packed_key_and_value() -> None:
    odd = ModelConfig("odd", 2, 8, 2, 127)
    with pytest.raises(ConfigError, match=r"head_dim.*an even number for kv_cache_quant_type int4_zp") as info:
        build_layout(odd, CacheConfig(kv_cache_quant_type="int4_zp"), ParallelConfig())
    assert "Fix: use a model with an even head_dim or another kv_cache_quant_type" in str(info.value)


@pytest.mark.parametrize("platform", ["cuda", "metax", "xpu"])
def test_mla_with_int4_zp_is_the_full_latent_a_byte_a_value_as_fastdeploys_runner_allocates_it(platform: str) -> None:
    """FastDeploy's MLA backend states ``[N, 1, block, kv_lora_rank + qk_rope_head_dim]`` whatever the quantization
    (``mla_attention_backend.py`` ``get_kv_cache_shape``, lines 390-400) and its runner allocates ``uint8`` whenever
    ``kv_cache_quant_type`` is set (``gpu_model_runner.py`` ``initialize_kv_cache``, lines 1410-1430): not packed,
    on any platform, the bytes of an 8-bit MLA cache."""
    mla = ModelConfig("mla", 2, 16, 16, 192, kv_lora_rank=512, qk_rope_head_dim=64)
    layout = build_layout(mla, CacheConfig(kv_cache_quant_type="int4_zp"), ParallelConfig())
    assert [(spec.role, spec.block_shape, spec.dtype) for spec in layout.tensors] == [
        ("key", (1, 64, 576), "uint8"),
        ("key", (1, 64, 576), "uint8"),
    ]
    assert (
        layout.bytes_per_block == build_layout(mla, CacheConfig(cache_dtype="int8"), ParallelConfig()).bytes_per_block
    )
    shaped = load_platform(discover()[platform][0]).cache_layout(layout, 5)
    assert shaped.bytes_per_block == layout.bytes_per_block and len(shaped.tensors) == 2


def test_a_role_shape_is_a_checked_record() -> None:
    with pytest.raises(RecordError, match="shape"):
        CacheRoleShape("key", (4, 0, 8), "uint8")
    with pytest.raises(RecordError, match="dtype"):
        CacheRoleShape("key", (4, 8), "int4")
    with pytest.raises(RecordError, match="role"):
        CacheRoleShape("keys", (4, 8), "uint8")


def test_the_checker_names_the_role_the_layer_kind_and_both_sizes() -> None:
    request = next(r for r in shape_cases() if r.attention == "gqa" and r.quant_type == "block_wise_fp8")
    key, value, key_scale, value_scale = request.default
    wrong = (key, value, CacheRoleShape("key_scale", key_scale.shape, "float32"), value_scale)
    [violation] = shape_violations(request, wrong)
    assert violation.startswith("gqa layer, quant block_wise_fp8")
    assert "role key_scale is [3, 8, 64] float32 = 6144 bytes" in violation and "is 3072 bytes" in violation
    assert shape_violations(request, (value, key, key_scale, value_scale)) == [
        (
            "gqa layer, quant block_wise_fp8, cache dtype float8_e4m3fn: roles ['value', 'key', 'key_scale', "
            "'value_scale'], expected ['key', 'value', 'key_scale', 'value_scale'] in that order"
        )
    ]
    moved = (CacheRoleShape("key", (8, 3, 64, 128), "uint8"), value, key_scale, value_scale)
    assert "does not start with the block axis" in shape_violations(request, moved)[0]


SHAPES_PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import CacheRoleShape, Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity({name!r}, "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "here", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def kv_cache_shapes(request):
{body}
"""

DOUBLES_EVERY_KEY = """    key, *rest = request.default
    return (CacheRoleShape("key", (*key.shape[:-1], key.shape[-1] * 2), key.dtype), *rest)
"""

DOUBLES_ON_7_BLOCKS = """    if request.num_blocks != 7:
        return None
    key, *rest = request.default
    return (CacheRoleShape("key", (*key.shape[:-1], key.shape[-1] * 2), key.dtype), *rest)
"""


def test_a_plugin_declaring_other_bytes_is_refused_at_load(make_plugin) -> None:
    make_plugin("bigkey", source=SHAPES_PLUGIN.format(name="bigkey", body=DOUBLES_EVERY_KEY))
    with pytest.raises(PlatformDriftError) as info:
        select_platform({"FD_PLATFORM": "bigkey"})
    message = str(info.value)
    assert "its kv_cache_shapes answer changes what the core counts in the load-time cases" in message
    assert f"({len(shape_cases())} layer kinds and quantizations)" in message
    assert "gqa layer, quant none, cache dtype bfloat16: role key is [3, 8, 64, 256] bfloat16" in message
    assert "Fix: answer the roles of request.default" in message


def test_a_plugin_drifting_only_on_some_call_is_refused_at_that_call(make_plugin) -> None:
    make_plugin("sly", source=SHAPES_PLUGIN.format(name="sly", body=DOUBLES_ON_7_BLOCKS))
    platform = select_platform({"FD_PLATFORM": "sly"}).platform  # every load-time case passes
    layout = build_layout(load_model_config(f"{ROOT}/{LLAMA}"), CacheConfig(), ParallelConfig())
    assert platform.cache_layout(layout, 6).tensors[0].shape(6) == (6, 8, 64, 128)
    with pytest.raises(PlatformDriftError, match="for this call") as info:
        platform.cache_layout(layout, 7)
    assert "role key is [7, 8, 64, 256] bfloat16 = 1835008 bytes for 7 blocks; the core's [7, 8, 64, 128]" in str(
        info.value
    )


def test_shape_requests_carry_what_a_backend_needs() -> None:
    model = load_model_config(f"{ROOT}/{QWEN}")
    layout = build_layout(model, CacheConfig(), ParallelConfig(tensor_parallel_size=2))
    request = shape_request(layout, 5)
    assert (request.attention, request.kv_heads, request.head_dim, request.block_size) == ("gqa", 2, 128, 64)
    assert [role.shape for role in request.default] == [(5, 2, 64, 128)] * 2


# A cache in host memory, shared like cpu's, laid out tokens-before-heads; its export refuses any
# other shape, so a run that allocated, published or attached the core's order fails.
FLASHCPU = host_sharing_plugin(
    "flashcpu",
    export="""
assert shape[1] == 64 and shape[2] == 2, f"not the platform's shape: {shape}"
return export_host_tensor(name, shape, dtype)
""",
    open="""
assert shape[1] == 64 and shape[2] == 2, f"not the platform's shape: {shape}"
return open_host_tensor(name, handle, shape, dtype)
""",
    extra="""
from fd_platforms.kit.cache_shapes import tokens_before_heads

@hookimpl
def kv_cache_shapes(request):
    return tokens_before_heads(request)
""",
)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["decode", "mixed"])
def test_a_run_allocates_publishes_and_attaches_the_platforms_shapes(make_plugin, role: str) -> None:
    site = make_plugin("flashcpu", source=FLASHCPU)
    done = subprocess.run(
        [
            SCRIPT,
            "run",
            "--platform",
            "flashcpu",
            "--model",
            QWEN,
            "--tp",
            "2",
            "--device-memory",
            "256MiB",
            "--role",
            role,
            "--swap-space",
            "32MiB",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=clean_env(PYTHONPATH=str(site)),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["platform"] == "flashcpu"


def test_xpu_plans_int4_zp_at_one_value_a_byte_as_fastdeploys_xpu_runner_allocates_it() -> None:
    """FastDeploy's XPU backend states ``[N, kv_heads, block, head_dim]`` whatever the quantization
    (``backends/xpu/attention.py`` ``get_kv_cache_shape``) and its runner allocates it as int8, where GPUs
    pack two values a byte (``append_attn_backend.py``): the core's table applies that, so XPU's plan
    counts twice the GPU's bytes and the cache it allocates is the one planned."""
    rows = {name: plan_json(name, "--kv-cache-quant-type", "int4_zp") for name in ("cuda", "xpu")}
    assert rows["xpu"]["bytes_per_block"] == 2 * rows["cuda"]["bytes_per_block"] == 2 * 8 * 64 * 128 * 32  # k+v, 1 B
    assert tensors(rows["xpu"]) == {"key": (["N", 8, 64, 128], "int8"), "value": (["N", 8, 64, 128], "int8")}
