"""Allocating one rank's plain (unshared) KV cache on the cpu platform: order, names, dtypes, zeros, failures."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fd_platforms.contract.errors import ConfigError, DeviceAllocError, DevicePlacementError
from fd_platforms.engine.kv_cache import allocate_kv_cache
from fd_platforms.loading.platform import Platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import CacheLayout, build_layout

paddle = pytest.importorskip("paddle")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def layout_of(model: str, tp: int = 4, **cache: Any) -> CacheLayout:
    return build_layout(
        load_model_config(EXAMPLES / model),
        CacheConfig(block_size=16, **cache),
        ParallelConfig(tensor_parallel_size=tp),
    )


def test_cpu_platform_allocates_the_layout_in_order_with_its_names(cpu: Platform) -> None:
    layout = layout_of("qwen3-30b-a3b")
    kv = allocate_kv_cache(layout, 4, cpu.identity.device_string(layout.local_device))
    assert kv.device == "cpu" and kv.num_blocks == 4
    assert kv.names == layout.names() and len(kv.tensors) == len(layout.tensors) == 96
    assert kv.names[:3] == ("key_caches_0_rank0.device0", "value_caches_0_rank0.device0", "key_caches_1_rank0.device0")
    for spec, tensor in zip(layout.tensors, kv.tensors, strict=True):
        assert tuple(tensor.shape) == spec.shape(4)
        assert tensor.dtype == paddle.bfloat16
        assert tensor.place.is_cpu_place()
    assert kv.nbytes == 4 * layout.bytes_per_block
    assert kv.by_name()["value_caches_47_rank0.device0"] is kv.tensors[-1]
    assert not any(t.view(paddle.uint8).numpy().any() for t in kv.tensors[:3]), "zero-filled"
    kv.clear()
    assert kv.tensors == [] and kv.cleared


def test_tensors_are_zero_copy_views_of_raw_bytes() -> None:
    kv = allocate_kv_cache(layout_of("llama-3.1-8b"), 2, "cpu")
    first = kv.tensors[0]
    first[0, 0, 0, 0] = 1.5
    assert first[0, 0, 0, 0].item() == 1.5


@pytest.mark.parametrize(
    ("model", "cache", "dtypes"),
    [
        ("qwen3-30b-a3b", {"cache_dtype": "float8_e4m3fn"}, {"uint8"}),  # FastDeploy's 8-bit caches are uint8
        ("qwen3-30b-a3b", {"cache_dtype": "int8"}, {"uint8"}),
        (
            "qwen3-30b-a3b",
            {"cache_dtype": "float8_e4m3fn", "kv_cache_quant_type": "block_wise_fp8"},
            {"uint8", "bfloat16"},
        ),  # scales in the model's dtype (Paddle's default dtype in FastDeploy's worker)
        ("deepseek-v3", {}, {"bfloat16"}),
        ("deepseek-v3.2", {}, {"uint8"}),
    ],
)
def test_every_cache_dtype_takes_the_same_path(model: str, cache: dict[str, str], dtypes: set[str]) -> None:
    layout = layout_of(model, **cache)
    kv = allocate_kv_cache(layout, 2, "cpu")
    assert {str(tensor.dtype).removeprefix("paddle.") for tensor in kv.tensors} == dtypes
    assert [tuple(tensor.shape) for tensor in kv.tensors] == [spec.shape(2) for spec in layout.tensors]


class FakeTensor:
    def view(self, dtype: str) -> FakeTensor:
        return self


class FailingPaddle:
    """A paddle stand-in of a build with custom device ``npu`` registered, whose allocator fails on the
    ``fail_at``-th tensor (never: 0); it tracks the live ones."""

    uint8 = "uint8"
    bfloat16 = "bfloat16"
    device = SimpleNamespace(get_all_custom_device_type=lambda: ["npu"])

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls, self.made = fail_at, 0, []

    def is_compiled_with_cuda(self) -> bool:
        return False

    is_compiled_with_xpu = is_compiled_with_ipu = is_compiled_with_cuda

    def zeros(self, shape: list[int], dtype: str, device: str) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError("(External) CustomDevice error, the error code is : 2.\n  [more C++ context]")
        tensor = FakeTensor()
        self.made.append(weakref.ref(tensor))
        return tensor


def test_a_failed_tensor_names_itself_and_nothing_is_kept() -> None:
    layout = layout_of("qwen3-30b-a3b")
    fake = FailingPaddle(fail_at=3)
    with pytest.raises(DeviceAllocError) as raised:
        allocate_kv_cache(layout, 1000, "npu:1", paddle=fake)
    message = str(raised.value)
    assert "key_caches_1_rank0.device0 [1000, 1, 16, 128] bfloat16" in message
    assert "on npu:1 after 2 of 96 tensors" in message
    assert "error code is : 2." in message and "more C++ context" not in message
    assert "Fix: plan fewer blocks" in message
    gc.collect()
    assert all(ref() is None for ref in fake.made), "tensors allocated before the failure were dropped"


def test_a_device_type_this_paddle_cannot_place_tensors_on_is_a_placement_error_before_any_tensor() -> None:
    """A 128 KiB cache on a device Paddle does not drive: what to install, never "plan fewer blocks"."""
    fake = FailingPaddle(fail_at=0)
    with pytest.raises(DevicePlacementError) as raised:
        allocate_kv_cache(layout_of("qwen3-30b-a3b"), 1, "zephyr_tpu:0", paddle=fake)
    message = str(raised.value)
    assert raised.value.exit_code == 2 and not isinstance(raised.value, DeviceAllocError)
    assert "device 'zephyr_tpu:0'" in message and "it places them on cpu, npu." in message
    assert "Fix: install the vendor's Paddle custom-device plugin that registers 'zephyr_tpu'" in message
    assert "fewer blocks" not in message
    assert fake.calls == 0, "refused before any tensor is allocated"


def test_gpu_on_a_paddle_without_cuda_is_a_placement_error() -> None:
    if paddle.is_compiled_with_cuda():
        pytest.skip(f"this paddle {paddle.__version__} is compiled with CUDA: it places tensors on gpu")
    with pytest.raises(DevicePlacementError) as raised:
        allocate_kv_cache(layout_of("llama-3.1-8b"), 2, "gpu:0")
    message = str(raised.value)
    assert message.startswith("device 'gpu:0': this Paddle cannot place tensors on device type 'gpu'")
    assert "Fix: install Paddle's CUDA build (pip install paddlepaddle-gpu)" in message
    assert "fewer blocks" not in message


@pytest.mark.parametrize("blocks", [0, -1, True, 2.0])
def test_block_count_is_validated(blocks: object) -> None:
    with pytest.raises(ConfigError, match="num_blocks="):
        allocate_kv_cache(layout_of("llama-3.1-8b"), blocks, "cpu")  # type: ignore[arg-type]
