"""Engine-given tensor specs: the engine states each layer's tensors as its attention backend does,
the core checks them (order, names, block axis, the planner's bytes) instead of deriving them.

FastDeploy's cases, each from the shapes its backend states (cited per test), run on the cpu platform.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

import pytest
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheSharingError, ConfigError
from fd_platforms.contract.types import CacheRoleShape
from fd_platforms.engine import allocate_kv_cache, initialize_kv_cache, manage_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig
from fd_platforms.rules.layout import CacheLayout, build_layout

paddle = pytest.importorskip("paddle")

N = 3  # blocks
H, B, D = 8, 64, 128  # kv heads per rank, block size, head dim
GQA = ModelConfig("gqa", 2, 32, H, D)
MLA = ModelConfig("mla", 2, 16, 16, 192, kv_lora_rank=512, qk_rope_head_dim=64)
MIXED = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "mixed"}
DECODE = {**MIXED, "splitwise_role": "decode"}


def layout_of(model: ModelConfig = GQA, **cache: object) -> CacheLayout:
    return build_layout(model, CacheConfig(block_size=B, **cache), ParallelConfig())  # type: ignore[arg-type]


def spec(role: str, shape: tuple[int, ...], dtype: str) -> CacheRoleShape:
    return CacheRoleShape(role, shape, dtype)  # type: ignore[arg-type]


def allocated(layout: CacheLayout, specs: tuple[CacheRoleShape, ...]) -> list[tuple[str, list[int], str]]:
    cache = allocate_kv_cache(layout, N, "cpu", tensor_specs=specs)
    got = [
        (name, list(t.shape), str(t.dtype).removeprefix("paddle."))
        for name, t in zip(cache.names, cache.tensors, strict=False)
    ]
    cache.clear()
    return got


def expected(layout: CacheLayout, specs: tuple[CacheRoleShape, ...]) -> list[tuple[str, list[int], str]]:
    """Layer-major, each layer the engine's specs in its order, named as FastDeploy names them."""
    return [
        (name, list(s.shape), s.dtype)
        for name, s in zip(layout.names(), [s for _ in range(layout.num_layers) for s in specs], strict=True)
    ]


# FastDeploy's cases ------------------------------------------------------------------------------

APPEND_ATTN = {
    # append_attn_backend.py get_kv_cache_shape: key/value [N, kv_heads, block, head_dim]; gpu_model_runner.py
    # initialize_kv_cache: the model's dtype, uint8 when quantized, block_wise_fp8 scales the key's first three
    # axes in the default dtype, per layer key, value, key_scale, value_scale.
    "bf16": ({}, (spec("key", (N, H, B, D), "bfloat16"), spec("value", (N, H, B, D), "bfloat16"))),
    "block_wise_fp8": (
        {"kv_cache_quant_type": "block_wise_fp8"},
        (
            spec("key", (N, H, B, D), "uint8"),
            spec("value", (N, H, B, D), "uint8"),
            spec("key_scale", (N, H, B), "bfloat16"),
            spec("value_scale", (N, H, B), "bfloat16"),
        ),
    ),
    "int4_zp": (  # two values a byte: [N, H, B, D // 2]
        {"kv_cache_quant_type": "int4_zp"},
        (spec("key", (N, H, B, D // 2), "uint8"), spec("value", (N, H, B, D // 2), "uint8")),
    ),
}


@pytest.mark.parametrize("case", list(APPEND_ATTN))
def test_gpu_append_attn_shapes_are_allocated_as_stated(case: str) -> None:
    cache, specs = APPEND_ATTN[case]
    layout = layout_of(**cache)
    assert allocated(layout, specs) == expected(layout, specs)


def test_xpu_shapes_int8_and_int4_zp_one_value_a_byte_in_the_order_its_kernels_index() -> None:
    """``backends/xpu/attention.py``: ``get_kv_cache_shape`` is ``[N, kv_heads, block, head_dim]`` whatever the
    quantization and ``forward_mixed`` reads ``caches[2 * layer]`` and ``caches[2 * layer + 1]``; the XPU
    runner allocates a quantized cache as int8 (``xpu_model_runner.py`` ``initialize_kv_cache``)."""
    xpu_int8 = (spec("key", (N, H, B, D), "int8"), spec("value", (N, H, B, D), "int8"))
    layout = layout_of(cache_dtype="int8").on_device_type("xpu")
    got = allocated(layout, xpu_int8)
    assert got == expected(layout, xpu_int8)
    layer = 1  # caches[2 * layer] is the layer's key, caches[2 * layer + 1] its value
    assert [name for name, _, _ in got][2 * layer : 2 * layer + 2] == [
        "key_caches_1_rank0.device0",
        "value_caches_1_rank0.device0",
    ]
    int4 = layout_of(kv_cache_quant_type="int4_zp").on_device_type("xpu")
    assert allocated(int4, xpu_int8) == expected(int4, xpu_int8)


def test_xpu_block_wise_fp8_is_key_and_value_alone_as_its_runner_allocates_them() -> None:
    """``xpu_model_runner.py`` ``initialize_kv_cache`` (lines 1230-1283): key and value ``int8`` of the backend's
    ``[N, kv_heads, block, head_dim]`` for any quantization, and no scales; the GPU's four tensors are refused."""
    specs = (spec("key", (N, H, B, D), "int8"), spec("value", (N, H, B, D), "int8"))
    layout = layout_of(kv_cache_quant_type="block_wise_fp8").on_device_type("xpu")
    got = allocated(layout, specs)
    assert len(got) == 2 * layout.num_layers and got == expected(layout, specs)
    assert layout.bytes_per_block == layout_of(cache_dtype="int8").bytes_per_block
    gpu = (*specs, spec("key_scale", (N, H, B), "bfloat16"), spec("value_scale", (N, H, B), "bfloat16"))
    with pytest.raises(ConfigError, match="roles"):
        allocated(layout, gpu)


def test_metax_flash_backend_tokens_before_heads() -> None:
    """MetaX's flash backend states ``[N, block, kv_heads, head_dim]`` (``metax_model_runner.py`` with its
    backend's ``get_kv_cache_shape``), scales ``[N, block, kv_heads]``: the same bytes, other axes."""
    specs = (
        spec("key", (N, B, H, D), "uint8"),
        spec("value", (N, B, H, D), "uint8"),
        spec("key_scale", (N, B, H), "bfloat16"),
        spec("value_scale", (N, B, H), "bfloat16"),
    )
    layout = layout_of(kv_cache_quant_type="block_wise_fp8")
    assert allocated(layout, specs) == expected(layout, specs)


def test_mla_states_one_latent_a_layer_as_caches_layer_id_indexes_it() -> None:
    """``mla_attention_backend.py``: ``get_kv_cache_shape`` is ``[N, 1, block, kv_lora_rank + qk_rope_head_dim]``
    and every forward reads ``forward_meta.caches[layer.layer_id]``; ``gpu_model_runner.py`` puts the key
    alone in the list for MLA (``value_cache_shape`` empty), the key's scales after it with block_wise_fp8."""
    latent = (spec("key", (N, 1, B, 576), "uint8"),)
    layout = layout_of(MLA, cache_dtype="fp8")
    got = allocated(layout, latent)
    assert got == expected(layout, latent) and [name for name, _, _ in got][1] == "key_caches_1_rank0.device0"
    with_scales = (*latent, spec("key_scale", (N, 1, B), "bfloat16"))
    layout = layout_of(MLA, kv_cache_quant_type="block_wise_fp8")
    assert allocated(layout, with_scales) == expected(layout, with_scales)
    layout = layout_of(MLA, kv_cache_quant_type="int4_zp")  # the backend ignores it; the runner's uint8, full width
    assert allocated(layout, latent) == expected(layout, latent)


# Refusals ----------------------------------------------------------------------------------------

BF16 = APPEND_ATTN["bf16"][1]


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        ((BF16[1], BF16[0]), "roles ['value', 'key']"),
        ((BF16[0], BF16[0]), "roles ['key', 'key']"),
        ((BF16[0],), "roles ['key']"),
        ((spec("key", (N, H, B, D), "float32"), BF16[1]), "the core's [3, 8, 64, 128] bfloat16 is 393216 bytes"),
        ((spec("key", (H, N, B, D), "bfloat16"), BF16[1]), "does not start with the block axis"),
    ],
)
def test_an_engine_spec_the_layout_does_not_allow_is_a_config_error_naming_it(specs: tuple, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        allocate_kv_cache(layout_of(), N, "cpu", tensor_specs=specs)
    error = info.value
    assert error.field == "tensor_specs" and says in str(error), str(error)
    assert "key [3, 8, 64, 128] bfloat16, value [3, 8, 64, 128] bfloat16" in error.allowed and "Fix: " in str(error)


def test_gpus_packed_int4_zp_stated_at_xpus_width_is_refused_by_the_planners_bytes() -> None:
    unpacked = (spec("key", (N, H, B, D), "int8"), spec("value", (N, H, B, D), "int8"))
    with pytest.raises(ConfigError, match="planner's bytes"):
        allocate_kv_cache(layout_of(kv_cache_quant_type="int4_zp"), N, "cpu", tensor_specs=unpacked)


def test_specs_that_are_not_records_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"tensor_specs=.*CacheRoleShape.*Fix: "):
        allocate_kv_cache(layout_of(), N, "cpu", tensor_specs=[((N, H, B, D), "bfloat16")])  # type: ignore[list-item]


def test_a_refused_spec_is_raised_before_any_hook_runs(signal_name: str) -> None:
    platform = select_platform({"FD_PLATFORM": "cpu"}).platform
    called: list[str] = []
    platform._call = lambda hook, *a, **k: called.append(hook)  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="tensor_specs"):
        initialize_kv_cache(
            platform, kv_request(layout_of(), N, instance=signal_name, tensor_specs=(BF16[1], BF16[0]), **MIXED)
        )
    assert called == []


def test_derived_shapes_stay_the_default() -> None:
    platform = select_platform({"FD_PLATFORM": "cpu"}).platform
    layout = layout_of()
    assert platform.cache_layout(layout, N).allocated_roles == layout.roles


# Across processes --------------------------------------------------------------------------------

METAX = (spec("key", (N, B, H, D), "bfloat16"), spec("value", (N, B, H, D), "bfloat16"))


def manage_with_specs(signal_name: str, conn: Connection) -> None:
    """A cache manager publishing rank 0's cache in the engine's MetaX-like specs; writes 5.0 first."""
    import fd_platforms

    managed = manage_kv_cache(
        fd_platforms.current_platform(),
        kv_request(layout_of(), N, num_cpu_blocks=0, instance=signal_name, tensor_specs=METAX),
    )
    managed.kv_cache.tensors[0][0, 0, 0, 0] = 5.0
    conn.send("ready")
    conn.recv()
    managed.clear(30)
    conn.send("cleared")


@contextmanager
def manager(signal_name: str) -> Iterator[tuple[Connection, int]]:
    ours, theirs = warm.Pipe()
    process = warm.Process(target=manage_with_specs, args=(signal_name, theirs))
    process.start()
    try:
        assert ours.poll(60) and ours.recv() == "ready"
        yield ours, process.pid  # type: ignore[misc]
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(10)


@pytest.mark.slow
def test_a_worker_stating_the_managers_specs_attaches_across_processes(signal_name: str) -> None:
    platform = select_platform({"FD_PLATFORM": "cpu"}).platform
    with CacheReadySignal.create(1, signal_name), manager(signal_name) as (conn, pid):
        with pytest.raises(CacheSharingError, match=r"\[3, 64, 8, 128\]"):  # derived shapes differ from the published
            initialize_kv_cache(
                platform, kv_request(layout_of(), N, instance=signal_name, creator_pid=pid, timeout=30, **DECODE)
            )
        cache = initialize_kv_cache(
            platform,
            kv_request(layout_of(), N, instance=signal_name, creator_pid=pid, timeout=30, tensor_specs=METAX, **DECODE),
        )
        assert not cache.created and [list(t.shape) for t in cache.tensors[:2]] == [[N, B, H, D]] * 2
        assert cache.tensors[0][0, 0, 0, 0].item() == 5.0, "the manager's write is seen here"
        cache.clear()
        conn.send("clear")
        assert conn.poll(30) and conn.recv() == "cleared"
