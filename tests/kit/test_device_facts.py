"""Device facts of every Paddle-driven platform through the seam: a fake ``paddle`` holding exactly
the calls each facts class declares, and a check that each of those calls exists in the installed
Paddle (so a renamed API fails here, without hardware)."""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import importlib
import json
import logging
import os
import re
import secrets
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from engine_processes import qwen_layout
from fake_paddle import (
    CUSTOM,
    PLATFORMS,
    FakeIpc,
    FakeTensor,
    GiB,
    cuda_paddle,
    custom_paddle,
    facts_of,
    no_pinned_place,
    registered,
    rocm_paddle,
    with_paddle,
    xpu_paddle,
)
from fastdeploy_standins import read_xpu_record

import fd_platforms_cuda
import fd_platforms_metax
import fd_platforms_xpu
from fd_platforms.contract.errors import CacheSharingError, CacheSignalError, ConfigError, HostAllocError
from fd_platforms.engine.initialize import check_can_attach
from fd_platforms.engine.kv_cache import attach_kv_cache, export_kv_cache
from fd_platforms.fastdeploy.handles import encode_handle as encode_record
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.records import record_layout
from fd_platforms.fastdeploy.signals import CACHE_READY, FastDeploySignal
from fd_platforms.kit.allocator_flags import VMM_V1, VMM_V2, read_flag
from fd_platforms.kit.custom_device import CustomDeviceFacts
from fd_platforms.kit.device_facts import PADDLE_UINT8, DeviceFacts, paddle_attribute
from fd_platforms.kit.host_memory import PinningUnavailable, allocate_host
from fd_platforms.kit.paddle_platform import PaddlePlatform
from fd_platforms.kit.rocm import RocmFacts
from fd_platforms.kit.vendor_device import VendorDeviceRuntime, handle_text

# -- CUDA --------------------------------------------------------------------------------------


def test_cuda_confirms_a_cuda_build_with_devices() -> None:
    detection = facts_of("cuda", cuda_paddle()).confirm()
    assert (detection.available, detection.device_count) == (True, 8)


@pytest.mark.parametrize(
    ("paddle", "reason"),
    [
        (
            cuda_paddle(compiled=False),
            "no CUDA (paddle.is_compiled_with_cuda() is False). Fix: pip install paddlepaddle-gpu",
        ),
        (cuda_paddle(rocm=True), "for ROCm, not CUDA"),
        (
            cuda_paddle(count=0),
            "paddle sees no CUDA device. Fix: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
        ),
    ],
)
def test_cuda_refuses_builds_and_machines_it_cannot_use(paddle: SimpleNamespace, reason: str) -> None:
    detection = facts_of("cuda", paddle).confirm()
    assert not detection.available and reason in detection.reason


def test_cuda_memory_comes_from_mem_get_info_and_the_allocator_peak() -> None:
    memory = facts_of("cuda", cuda_paddle()).memory(1)
    assert (memory.total_bytes, memory.free_bytes, memory.process_bytes) == (80 * GiB, 70 * GiB + 1, 3 * GiB)
    assert "paddle.cuda.mem_get_info(1)" in memory.source


def test_cuda_pins_through_a_pinned_place_and_release_drops_the_tensor() -> None:
    made: list[tuple[list[int], str, object]] = []

    def empty(shape: list[int], dtype: str, device: object) -> FakeTensor:
        made.append((shape, dtype, device))
        return FakeTensor(shape[0])

    buffer = facts_of("cuda", cuda_paddle(empty=empty)).pin(4096)
    assert made == [([4096], "uint8", "pinned")]
    assert (buffer.pinned, buffer.kind, buffer.nbytes) == (True, "cuda_pinned", 4096)
    view = buffer.numpy()
    view[:3] = [1, 2, 3]
    assert list(buffer.numpy()[:3]) == [1, 2, 3]
    del view
    buffer.release()
    assert buffer.released


def test_cuda_without_cuda_cannot_pin() -> None:
    with pytest.raises(PinningUnavailable, match="no CUDA"):
        facts_of("cuda", cuda_paddle(compiled=False)).pin(4096)


def test_cuda_pinned_allocation_failure_names_the_size() -> None:
    def empty(shape: list[int], dtype: str, device: object) -> FakeTensor:
        raise MemoryError("cudaHostAlloc failed")

    with pytest.raises(HostAllocError, match="could not allocate 4096 bytes of pinned host memory"):
        facts_of("cuda", cuda_paddle(empty=empty)).pin(4096)


def test_a_build_without_the_pinned_place_cannot_pin() -> None:
    paddle = cuda_paddle()
    paddle.CUDAPinnedPlace = no_pinned_place
    with pytest.raises(PinningUnavailable, match="CUDAPinnedPlace"):
        facts_of("cuda", paddle).pin(64)


# -- XPU ---------------------------------------------------------------------------------------


def test_xpu_confirms_and_reports_free_as_total_minus_used() -> None:
    facts = facts_of("xpu", xpu_paddle())
    assert facts.confirm().device_count == 8
    memory = facts.memory(0)
    assert (memory.total_bytes, memory.free_bytes, memory.process_bytes) == (96 * GiB, 86 * GiB, 2 * GiB)


@pytest.mark.parametrize(
    ("paddle", "reason"),
    [
        (
            xpu_paddle(compiled=False),
            "no XPU support (paddle.is_compiled_with_xpu() is False). Fix: pip install paddlepaddle-xpu",
        ),
        (xpu_paddle(count=0), "no Kunlun XPU. Fix: check the driver (xpu-smi) and XPU_VISIBLE_DEVICES"),
    ],
)
def test_xpu_refuses_with_a_reason(paddle: SimpleNamespace, reason: str) -> None:
    detection = facts_of("xpu", paddle).confirm()
    assert not detection.available and reason in detection.reason


def test_xpu_block_wise_fp8_is_planned_and_shaped_as_fastdeploys_xpu_runner_allocates_it() -> None:
    """FastDeploy's XPU runner allocates key and value only, int8, with block_wise_fp8 as with any quantization
    (``worker/xpu_model_runner.py`` ``initialize_kv_cache``, gongshaotian/FastDeploy e53f518 lines 1230-1283): the
    XPU platform plans, shapes and takes those specs, where the GPU layout's four tensors a layer were asked."""
    from fd_platforms.contract.types import CacheRoleShape
    from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
    from fd_platforms.rules.layout import build_layout

    platform, cache, blocks = registered("xpu", xpu_paddle()), CacheConfig(kv_cache_quant_type="block_wise_fp8"), 5
    layout = build_layout(
        load_model_config("examples/qwen3-30b-a3b"), cache, ParallelConfig(tensor_parallel_size=2, local_rank=1)
    )
    runner = tuple(CacheRoleShape(role, (blocks, 2, 64, 128), "int8") for role in ("key", "value"))  # type: ignore[arg-type]
    stated = platform.cache_layout(layout, blocks, runner)
    own = platform.cache_layout(layout, blocks)  # the plugin's own shapes: the same two, int8
    for shaped in (stated, own):
        assert [(spec.role, spec.shape(blocks), spec.dtype) for spec in shaped.tensors[:3]] == [
            ("key", (blocks, 2, 64, 128), "int8"),
            ("value", (blocks, 2, 64, 128), "int8"),
            ("key", (blocks, 2, 64, 128), "int8"),
        ]
        assert len(shaped.tensors) == 2 * 48
    plan = platform.max_num_blocks(layout=layout, cache=cache)
    assert plan.bytes_per_block == 48 * 2 * 2 * 64 * 128  # key and value a byte a value, no scales
    assert plan.num_blocks == plan.budget_bytes // plan.bytes_per_block  # the blocks the two tensors a layer allow


def test_xpu_pins_through_the_xpu_pinned_place() -> None:
    with facts_of("xpu", xpu_paddle()).pin(128) as buffer:
        assert (buffer.pinned, buffer.kind) == (True, "xpu_pinned")
    with pytest.raises(PinningUnavailable, match="no XPU support"):
        facts_of("xpu", xpu_paddle(compiled=False)).pin(128)


# -- Paddle's ROCm build (dcu): the kit's RocmFacts --------------------------------------------------


def test_dcu_confirms_a_rocm_build_with_devices() -> None:
    detection = facts_of("dcu", rocm_paddle()).confirm()
    assert (detection.available, detection.device_count) == (True, 8)


@pytest.mark.parametrize(
    ("paddle", "reason"),
    [
        (
            rocm_paddle(rocm=False),
            (
                "not Paddle's ROCm build (paddle.is_compiled_with_rocm() is False). Fix: install "
                "Paddle's ROCm build (pip install paddlepaddle-dcu"
            ),
        ),
        (
            rocm_paddle(count=0),
            "paddle's ROCm build sees no device. Fix: check the driver (hy-smi or rocm-smi) and HIP_VISIBLE_DEVICES",
        ),
    ],
)
def test_dcu_refuses_other_builds_and_machines_without_devices(paddle: SimpleNamespace, reason: str) -> None:
    detection = facts_of("dcu", paddle).confirm()
    assert not detection.available and reason in detection.reason


def test_dcu_memory_is_the_devices_total_and_the_allocator_peak_with_free_unknown() -> None:
    memory = facts_of("dcu", rocm_paddle()).memory(3)
    assert (memory.total_bytes, memory.free_bytes, memory.process_bytes) == (64 * GiB + 3, None, 5 * GiB)
    assert "get_device_properties(3).total_memory" in memory.source and "free memory is unknown" in memory.source


def test_dcu_pins_through_the_pinned_place_and_only_on_a_rocm_build() -> None:
    made: list[object] = []

    def empty(shape: list[int], dtype: str, device: object) -> FakeTensor:
        made.append(device)
        return FakeTensor(shape[0])

    with facts_of("dcu", rocm_paddle(empty=empty)).pin(256) as buffer:
        assert (buffer.pinned, buffer.kind, buffer.nbytes, made) == (True, "rocm_pinned", 256, ["pinned"])
    with pytest.raises(PinningUnavailable, match="not Paddle's ROCm build"):
        facts_of("dcu", rocm_paddle(rocm=False)).pin(256)


def test_dcu_cannot_share_and_an_export_names_the_missing_paddle_ipc() -> None:
    """Paddle binds _share_cuda only under PADDLE_WITH_CUDA: the ROCm build has no IPC to export through."""
    platform = with_paddle("dcu", rocm_paddle())
    assert platform.cache_sharing() is None
    with pytest.raises(
        CacheSharingError,
        match=r"gpu tensors cannot be shared between processes \(tensor fd_kv\.x\.t\): "
        r"Paddle's ROCm build has no DenseTensor\._share_cuda",
    ):
        platform.export_cache_tensor("fd_kv.x.t", (8,), "uint8", "gpu:0")
    with pytest.raises(CacheSharingError, match="_share_cuda"):
        platform.open_cache_tensor("fd_kv.x.t", "{}", (8,), "uint8", "gpu:0")


def test_dcu_releases_cached_memory_through_empty_cache() -> None:
    paddle = rocm_paddle()
    assert with_paddle("dcu", paddle).release_device_memory("gpu:0") == "paddle.device.cuda.empty_cache()"
    assert paddle.emptied == [1]


# -- custom devices (Iluvatar, MetaX, GCU, Gaudi, Ascend): one implementation in the core ------------


@pytest.mark.parametrize("name", CUSTOM)
def test_custom_device_confirms_its_registered_type(name: str) -> None:
    device_type = PLATFORMS[name].device_type
    detection = facts_of(name, custom_paddle(["other_npu", device_type])).confirm()
    assert (detection.available, detection.device_count) == (True, 2)
    missing = facts_of(name, custom_paddle(["other_npu"])).confirm()
    assert not missing.available
    assert f"registers no {device_type!r} device (custom device types: other_npu)" in missing.reason
    assert "CUSTOM_DEVICE_ROOT" in missing.reason
    empty = facts_of(name, custom_paddle([device_type], count=0)).confirm()
    assert not empty.available and PLATFORMS[name].visible_devices_env in empty.reason


@pytest.mark.parametrize("name", CUSTOM)
def test_custom_device_memory_says_free_is_unknown(name: str) -> None:
    memory = facts_of(name, custom_paddle([PLATFORMS[name].device_type])).memory(1)
    assert (memory.total_bytes, memory.free_bytes, memory.process_bytes) == (64 * GiB, None, GiB)
    assert f"get_device_properties({PLATFORMS[name].device_type!r}, 1)" in memory.source
    assert "free memory is unknown" in memory.source


def test_custom_device_without_a_vendor_allocator_cannot_pin() -> None:
    facts = CustomDeviceFacts(custom_paddle(["npu"]), "npu", "NPU_VISIBLE_DEVICES")
    with pytest.raises(PinningUnavailable, match="no vendor host allocator is known for 'npu'"):
        facts.pin(64)


@pytest.mark.parametrize("name", ["intel_hpu", "npu"])
def test_gaudi_and_ascend_state_no_vendor_allocator_and_no_sharing(name: str) -> None:
    """SynapseAI's synHostMalloc and CANN's aclrtMallocHost are not the kit's VendorHostRuntime shape, and neither
    runtime has CUDA-shaped IPC: pageable host memory, and an export names what is missing."""
    platform = with_paddle(name, custom_paddle([name]))
    assert platform.host_runtime is None and platform.device_runtime is None and platform.cache_sharing() is None
    with pytest.raises(PinningUnavailable, match=f"no vendor host allocator is known for '{name}'"):
        platform.device_facts().pin(64)
    with pytest.raises(
        CacheSharingError, match=f"{name} tensors cannot be shared between processes .*no vendor device runtime"
    ):
        platform.export_cache_tensor("fd_kv.x.t", (8,), "uint8", f"{name}:0")


@pytest.mark.parametrize(
    ("name", "library", "alloc"),
    [("metax", "libmcruntime.so", "mcMallocHost"), ("gcu", "libtopsrt.so", "topsHostMalloc")],
)
def test_custom_device_with_an_absent_vendor_library_cannot_pin(name: str, library: str, alloc: str) -> None:
    runtime = PLATFORMS[name].host_runtime
    assert runtime is not None and (runtime.library, runtime.alloc) == (library, alloc)
    facts = facts_of(name, custom_paddle([PLATFORMS[name].device_type]))
    try:
        ctypes.CDLL(library)
    except OSError:
        with pytest.raises(PinningUnavailable, match=re.escape(library)):
            facts.pin(64)
    else:  # pragma: no cover - a machine with the vendor's runtime
        pytest.skip(f"{library} is installed here")


# -- the host-memory contract, one for every platform -------------------------------------------


def cannot_pin(nbytes: int) -> Any:
    raise PinningUnavailable("the runtime is absent")


def test_unpinnable_memory_falls_back_to_pageable_with_one_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fd_platforms"):
        buffer = allocate_host(8192, False, cannot_pin, "acme")
    with buffer:
        assert (buffer.pinned, buffer.kind, buffer.nbytes) == (False, "pageable", 8192)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        "platform 'acme' cannot pin host memory (the runtime is absent); using 8192 bytes of pageable memory"
    ]


def test_demanded_pinned_memory_that_cannot_be_had_is_an_error() -> None:
    with pytest.raises(
        HostAllocError,
        match=r"pinned host memory of 8192 bytes was required, but platform 'acme' "
        r"cannot pin here: the runtime is absent\. Fix: call host_alloc\(require_pinned=False\)",
    ):
        allocate_host(8192, True, cannot_pin, "acme")


def test_a_failed_pinned_allocation_is_not_hidden_by_the_fallback() -> None:
    def out_of_memory(nbytes: int) -> Any:
        raise HostAllocError(f"could not allocate {nbytes} bytes")

    with pytest.raises(HostAllocError, match="could not allocate 8192 bytes"):
        allocate_host(8192, False, out_of_memory, "acme")


@pytest.mark.parametrize("nbytes", [0, -1, True, 1.5])
def test_host_alloc_sizes_are_validated(nbytes: object) -> None:
    with pytest.raises(ValueError, match="nbytes="):
        allocate_host(nbytes, False, cannot_pin, "acme")  # type: ignore[arg-type]


# -- the platforms as plugins, with the seam filled by a fake -------------------------------------


def test_platform_hooks_use_the_facts_and_the_core_contract(caplog) -> None:
    cuda = with_paddle("cuda", cuda_paddle(compiled=False))
    assert not cuda.confirm_platform().available
    with caplog.at_level(logging.WARNING, logger="fd_platforms"), cuda.host_alloc(4096, False) as buffer:
        assert not buffer.pinned
    assert "platform 'cuda' cannot pin host memory" in caplog.text
    with pytest.raises(ConfigError, match=r"device_id=0 .*paddle sees 0 cuda device"):
        cuda.device_memory(0)
    with pytest.raises(ConfigError, match="device_id=-1"):
        cuda.device_memory(-1)


def test_device_memory_is_asked_only_of_devices_paddle_sees() -> None:
    cuda = with_paddle("cuda", cuda_paddle(count=2))
    assert cuda.device_memory(1).total_bytes == 80 * GiB
    with pytest.raises(ConfigError, match=r"device_id=2 .*below 2 .*CUDA_VISIBLE_DEVICES"):
        cuda.device_memory(2)


def test_only_iluvatar_declares_a_limit_and_says_why() -> None:
    limits = {name: platform.declared_limits() for name, platform in PLATFORMS.items()}
    assert all(limit == () for name, limit in limits.items() if name != "iluvatar")
    (limit,) = limits["iluvatar"]
    assert (limit.kind, limit.value) == ("max_tensor_elements", 2**31 - 1)
    assert "32-bit element offsets" in limit.reason


def test_plugins_hold_facts_not_logic() -> None:
    """Every plugin is a PaddlePlatform record; the custom-device ones share the core's facts class."""
    assert all(isinstance(platform, PaddlePlatform) for platform in PLATFORMS.values())
    assert all(PLATFORMS[name].facts is CustomDeviceFacts for name in CUSTOM)
    assert PLATFORMS["dcu"].facts is RocmFacts, "the ROCm facts are the kit's: plugins never import each other"
    for name in ("cuda", "xpu"):
        methods = {key for key, value in vars(PLATFORMS[name].facts).items() if callable(value)}
        assert methods <= {"confirm", "memory", "pin", "on_device"}, f"{name} implements only the seam"


# -- the declared calls exist in the installed Paddle --------------------------------------------


def lacking(paddle: Any, names: tuple[str, ...]) -> list[str]:
    return [f"paddle.{dotted}" for dotted in names if not callable(paddle_attribute(paddle, dotted))]


@pytest.mark.parametrize(
    "facts", [fd_platforms_cuda.CudaFacts, fd_platforms_xpu.XpuFacts, CustomDeviceFacts, RocmFacts]
)
def test_every_declared_paddle_call_exists_in_the_installed_paddle(facts: type[DeviceFacts]) -> None:
    paddle = importlib.import_module("paddle")
    missing = lacking(paddle, facts.paddle_calls)
    assert not missing, f"{facts.__name__} calls names this paddle {paddle.__version__} lacks: {missing}"


def test_the_uint8_dtype_field_of_paddles_ipc_metadata_is_the_installed_paddles() -> None:
    """A raw IPC handle is opened as Paddle's metadata of a uint8 tensor, whose dtype field is phi's enum value."""
    assert int(importlib.import_module("paddle").uint8) == PADDLE_UINT8


def leaves(node: object, prefix: str = "") -> list[str]:
    """Dotted names of the callables a SimpleNamespace tree holds."""
    if callable(node):
        return [prefix]
    return [name for key, child in vars(node).items() for name in leaves(child, f"{prefix}.{key}" if prefix else key)]


@pytest.mark.parametrize(
    "facts", [fd_platforms_cuda.CudaFacts, fd_platforms_xpu.XpuFacts, CustomDeviceFacts, RocmFacts]
)
def test_the_simulated_paddle_answers_confirm_and_memory_with_declared_calls_only(facts: type[DeviceFacts]) -> None:
    simulated = facts.simulated_paddle("sim_npu", 3, 5 * 2**30)
    assert set(leaves(simulated)) <= set(facts.paddle_calls), "a simulation invents no call the class does not declare"
    reader = facts(simulated, "sim_npu", "SIM_VISIBLE_DEVICES")
    assert (reader.confirm().available, reader.confirm().device_count) == (True, 3)
    memory = reader.memory(2)
    assert memory.total_bytes == 5 * 2**30 and memory.process_bytes == 0


def test_a_facts_class_without_a_simulation_says_none() -> None:
    assert DeviceFacts.simulated_paddle("x", 1, 1) is None


@pytest.mark.parametrize(
    ("facts", "build"), [(fd_platforms_cuda.CudaFacts, "cuda"), (fd_platforms_xpu.XpuFacts, "xpu")]
)
def test_device_build_calls_exist_in_that_build_and_are_why_the_cpu_wheel_cannot_share(facts, build: str) -> None:
    """The IPC calls are only in Paddle's device builds: present there, absent from the CPU wheel."""
    paddle = importlib.import_module("paddle")
    missing = lacking(paddle, facts.device_build_calls)
    if getattr(paddle, f"is_compiled_with_{build}")():
        assert not missing, f"{facts.__name__} calls names this {build} build lacks: {missing}"
    else:
        assert missing, f"the CPU wheel has {facts.device_build_calls}: they need not be device-build-only"


# -- sharing through Paddle's device IPC -------------------------------------------------------------


@pytest.mark.parametrize(("name", "make", "device"), [("cuda", cuda_paddle, "gpu:3"), ("xpu", xpu_paddle, "xpu:1")])
def test_ipc_export_and_open_map_the_same_device_memory(
    name: str, make: Callable[..., SimpleNamespace], device: str
) -> None:
    ipc = FakeIpc(name)
    facts = facts_of(name, make(ipc=ipc))
    shared = facts.export("fd_kv.x.key_caches_0_rank0.device3", (4, 2, 64, 128), "bfloat16", device)
    assert (shared.exported, shared.nbytes, shared.tensor.dtype) == (True, 4 * 2 * 64 * 128 * 2, "bfloat16")
    metadata = json.loads(shared.handle)
    assert metadata[0] == {"b64": base64.b64encode(ipc.key(0)).decode()}, "bytes travel as base64 in JSON"
    assert metadata[2] == shared.nbytes
    opened = facts.open(shared.name, shared.handle, (4, 2, 64, 128), "bfloat16", device)
    assert opened.exported is False and opened.tensor.dtype == "bfloat16"
    shared.tensor.memory()[7] = 9
    assert opened.tensor.memory()[7] == 9, "the opener sees the exporter's allocation, not a copy"
    opened.close()
    shared.close()
    assert shared.tensor is None and opened.closed


@pytest.mark.parametrize(("name", "make"), [("cuda", cuda_paddle), ("xpu", xpu_paddle)])
def test_export_and_open_run_on_the_tensors_device_and_restore_the_current_one(name: str, make) -> None:
    """Paddle labels an export with the *current* device and CUDA opens a handle on the current device:
    both must be the tensor's (XPU's export never switched; no open switched before)."""
    ipc = FakeIpc(name)
    facts = facts_of(name, make(ipc=ipc))
    shared = facts.export("fd_kv.x.t", (8,), "uint8", f"{facts.device_type}:5")
    assert ipc.exported_on == [5] and json.loads(shared.handle)[6] == 5, "the handle names the tensor's device"
    facts.open("fd_kv.x.t", shared.handle, (8,), "uint8", f"{facts.device_type}:2")
    assert ipc.opened_on == [2], "opened with the attacher's device current"
    assert ipc.switches == [5, 0, 2, 0] and ipc.current == 0, "the previous device is current again"


@pytest.mark.parametrize(("name", "make"), [("cuda", cuda_paddle), ("xpu", xpu_paddle)])
def test_releasing_device_memory_calls_paddles_empty_cache(name: str, make) -> None:
    ipc = FakeIpc(name)
    platform = with_paddle(name, make(ipc=ipc))
    assert platform.release_device_memory(f"{platform.device_type}:0") == f"paddle.device.{name}.empty_cache()"
    assert ipc.emptied == 1
    custom = with_paddle("iluvatar", custom_paddle(["iluvatar_gpu"]))
    assert custom.release_device_memory("iluvatar_gpu:0") is None, "no call declared: nothing to release"


def test_an_xpu_build_that_cannot_switch_devices_refuses_a_tensor_off_the_current_one() -> None:
    ipc = FakeIpc("xpu")
    facts = facts_of("xpu", xpu_paddle(ipc=ipc, can_switch=False))
    assert facts.export("fd_kv.x.t", (8,), "uint8", "xpu:0").exported, "the current device needs no switch"
    with pytest.raises(CacheSharingError) as caught:
        facts.export("fd_kv.x.t", (8,), "uint8", "xpu:3")
    message = str(caught.value)
    assert "xpu:3 is not this process's current xpu device (0 is)" in message
    assert "no paddle.base.core.set_xpu_current_device_id" in message and "XPU_VISIBLE_DEVICES" in message
    assert ipc.exported_on == [0], "nothing exported under the wrong device"


def test_vmm_memory_is_shared_through_paddles_vmm_handles_or_refused_naming_the_flag() -> None:
    flag = "FLAGS_use_virtual_memory_auto_growth"
    vmm = FakeIpc("cuda", vmm=True)
    facts = facts_of("cuda", cuda_paddle(ipc=vmm))
    shared = facts.export("fd_kv.x.t", (8,), "uint8", "gpu:0")
    assert len(json.loads(shared.handle)) == 5, "the build's VMM handle"
    assert facts.open("fd_kv.x.t", shared.handle, (8,), "uint8", "gpu:0").exported is False
    plain = facts_of("cuda", cuda_paddle(ipc=FakeIpc("cuda")))
    with pytest.raises(CacheSharingError, match=f"{flag} on in its creator.*set the same {flag}"):
        plain.open("fd_kv.x.t", shared.handle, (8,), "uint8", "gpu:0")
    legacy = FakeIpc("cuda", vmm=True, vmm_ipc=False)
    with pytest.raises(CacheSharingError, match=f"{flag} is on.*legacy IPC handle.*set {flag}=0"):
        facts_of("cuda", cuda_paddle(ipc=legacy)).export("fd_kv.x.t", (8,), "uint8", "gpu:0")


@pytest.mark.parametrize(("name", "make"), [("cuda", cuda_paddle), ("xpu", xpu_paddle)])
def test_fastdeploys_record_holds_the_raw_ipc_handle_and_a_raw_record_opens_on_the_attachers_device(
    name: str, make
) -> None:
    """FastDeploy's set_data_ipc writes a tensor's raw IPC handle: our export's record holds the handle inside
    Paddle's metadata, and a raw record (FastDeploy's creator) opens through Paddle's IPC as the
    allocation's start, with the attacher's device current and named (both were refused before)."""
    ipc = FakeIpc(name)
    facts = facts_of(name, make(ipc=ipc))
    tensor, shape = "key_caches_0_rank0.device3", (4, 2, 64, 128)
    shared = facts.export(tensor, shape, "bfloat16", f"{facts.device_type}:3")
    record = encode_record(tensor, shared.handle, name, shared.tensor.data_ptr())
    raw = record_layout(name).handle(record)
    assert record[:8] == bytes(8) and raw == ipc.key(0), "the raw handle, as FastDeploy's set_data_ipc writes it"
    opened = facts.open(tensor, handle_text(raw), shape, "bfloat16", f"{facts.device_type}:3")
    assert ipc.opened_with == [(raw, 0, shared.nbytes, PADDLE_UINT8, [4, 2, 64, 256], [], 3)], "Paddle's 7 fields"
    assert ipc.opened_on == [3] and ipc.current == 0, "opened on the attacher's device, the previous one restored"
    shared.tensor.memory()[5] = 7
    assert opened.tensor.dtype == "bfloat16" and opened.tensor.memory()[5] == 7, "the same allocation, no copy"


def test_an_xpu_cache_published_the_fastdeploy_way_is_read_by_fastdeploys_xpu_reader_and_ours() -> None:
    """An XPU export through the DeviceFacts seam writes FastDeploy's XPU record: the handle, for its transfer
    manager, and the tensor's device address, for its XPU runner (which read 0, past our 72-byte record's end,
    before). Our attacher on XPU opens the handle, as FastDeploy's transfer manager does."""
    ipc = FakeIpc("xpu")
    platform, suffix = registered("xpu", xpu_paddle(ipc=ipc)), f"t{secrets.token_hex(4)}"
    layout = dataclasses.replace(qwen_layout(), rank=secrets.randbelow(900) + 100, num_layers=1)  # names of its own
    with FastDeploySignal.create(CACHE_READY, suffix, layout.rank + 1):
        created = export_kv_cache(platform, layout, 2, suffix, FASTDEPLOY, 0)
        try:
            for index, name in enumerate(layout.names()[:2]):
                handle, data_ptr_addr = read_xpu_record(name)
                assert handle == ipc.key(index), "the transfer manager's way in: the handle"
                assert data_ptr_addr == created.tensors[index].data_ptr() == ipc.address(ipc.key(index)) != 0
            attached = attach_kv_cache(platform, layout, 2, suffix, None, FASTDEPLOY, 1)
            assert [metadata[0] for metadata in ipc.opened_with[:2]] == [ipc.key(0), ipc.key(1)]
            created.tensors[0].memory()[3] = 7
            assert attached.tensors[0].memory()[3] == 7, "the creator's allocation, opened through its handle"
            attached.clear(5)
        finally:
            created.clear(5)
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in layout.names())


def test_a_handle_a_raw_record_cannot_stand_for_is_refused_saying_why() -> None:
    """A raw handle names an allocation and FastDeploy's opener reads from its start: a tensor inside its
    allocation, or VMM memory (another kind of handle), cannot be written as one."""
    inside = facts_of("cuda", cuda_paddle(ipc=FakeIpc("cuda", offset=512)))
    shared = inside.export("key_caches_0_rank0.device0", (8,), "uint8", "gpu:0")
    with pytest.raises(
        CacheSharingError,
        match=r"key_caches_0_rank0.device0 starts 512 bytes into its device "
        r"allocation.*Fix: use the fd-platforms protocol",
    ):
        encode_record("key_caches_0_rank0.device0", shared.handle, "cuda")
    vmm = facts_of("cuda", cuda_paddle(ipc=FakeIpc("cuda", vmm=True)))
    shared = vmm.export("key_caches_0_rank0.device0", (8,), "uint8", "gpu:0")
    with pytest.raises(CacheSharingError, match=r"virtual-memory allocator.*FLAGS_use_virtual_memory_auto_growth=0"):
        encode_record("key_caches_0_rank0.device0", shared.handle, "cuda")


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("dcu", rocm_paddle),
        ("gcu", lambda: custom_paddle(["gcu"])),
        ("intel_hpu", lambda: custom_paddle(["intel_hpu"])),
        ("npu", lambda: custom_paddle(["npu"])),
    ],
)
def test_a_platform_that_cannot_share_refuses_an_attaching_worker_when_the_rule_decides(name: str, make) -> None:
    """No IPC export here: the engine's check refuses a worker sent to attach, before any wait; a creator is not."""
    platform = registered(name, make())
    assert platform.cache_sharing() is None
    attach = platform.should_create_cache_tensor(
        profile=False, num_cpu_blocks=0, storage_backend=None, splitwise_role="decode"
    )
    assert not attach.create
    with pytest.raises(
        CacheSharingError,
        match=f"rank 0: the rule decided the workers attach .*platform {name} cannot "
        "share KV cache tensors between processes",
    ):
        check_can_attach(platform, attach, "rank 0")
    create = platform.should_create_cache_tensor(
        profile=False, num_cpu_blocks=0, storage_backend=None, splitwise_role="mixed"
    )
    check_can_attach(platform, create, "rank 0")


def test_a_stale_or_foreign_ipc_handle_is_a_sharing_error() -> None:
    facts = facts_of("cuda", cuda_paddle())
    with pytest.raises(CacheSharingError, match="is not JSON"):
        facts.open("fd_kv.x.t", "not-json", (8,), "uint8", "gpu:0")


def test_a_custom_device_shares_only_through_a_vendor_runtime_that_loads() -> None:
    """Paddle has no IPC for custom devices: the platform declares sharing only where its vendor runtime's
    IPC calls load, and facts without a vendor runtime refuse an export by name."""
    missing = VendorDeviceRuntime(library="libfd-no-such-runtime.so", prefix="mc")
    assert CustomDeviceFacts.sharing is None and missing.sharing() is None
    assert "libfd-no-such-runtime.so (the mcIpc* calls) cannot be loaded" in (missing.missing() or "")
    assert dataclasses.replace(fd_platforms_metax.PLATFORM, device_runtime=missing).cache_sharing() is None
    facts = facts_of("iluvatar", custom_paddle(["iluvatar_gpu"]))  # no vendor device runtime given
    with pytest.raises(CacheSharingError, match=r"iluvatar_gpu tensors cannot be shared .*tensor fd_kv.x.t"):
        facts.export("fd_kv.x.t", (8,), "uint8", "iluvatar_gpu:0")


@pytest.mark.slow
def test_importing_paddle_through_the_core_keeps_the_processs_sigterm_handler() -> None:
    """A plain ``import paddle`` installs a handler that ends the process at once, skipping clean-up."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys, time\n"
        "def stop(*_):\n    print('clean-up ran'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "{importing}\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); print('no handler ran')\n"
    )
    ours = subprocess.run(
        [
            sys.executable,
            "-c",
            code.format(importing="from fd_platforms.contract.paddle_import import import_paddle; import_paddle()"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ours.stdout.strip() == "clean-up ran", ours.stderr
    plain = subprocess.run(
        [sys.executable, "-c", code.format(importing="import paddle")], capture_output=True, text=True, timeout=120
    )
    assert "clean-up ran" not in plain.stdout, "paddle's own handler: why the core keeps the previous one"


def test_a_driven_update_beside_fastdeploys_xpu_managers_is_refused_at_once() -> None:
    """FastDeploy's XPU cache transfer manager never answers CLEARING (its check_cache_status returns at once):
    the driver refuses before touching a signal instead of waiting its whole timeout; with our own managers
    (serve_kv_cache_status) it drives."""
    from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update

    platform = registered("xpu", xpu_paddle())
    with pytest.raises(CacheSharingError, match="FastDeploy's cache transfer manager on xpu has no clear or restore"):
        drive_kv_cache_update("9923", platform=platform, timeout=600)
    with pytest.raises(ConfigError, match="managers"):
        drive_kv_cache_update("9923", platform=platform, managers="theirs", timeout=1)
    suffix = f"t{secrets.token_hex(4)}"
    with pytest.raises(CacheSignalError, match="kv_cache_status"):  # past the refusal: no such signal here
        drive_kv_cache_update(suffix, platform=platform, managers="fd-platforms", timeout=1)


# -- Paddle's allocator flags, every generation ----------------------------------------------------

V1, V2 = VMM_V1.name, VMM_V2.name
#: Paddle builds of each generation: their allocator flags, compiled defaults and the environment's FLAGS_*.
BUILDS = {
    "neither flag": ({}, {}, {}),
    "V1 on": ({V1: True}, {}, {V1: "1"}),
    "V2 on by default": ({V1: False, V2: True}, {V2: True}, {}),
    "V2 set by the environment": ({V1: False, V2: True}, {}, {V2: "1"}),
    "V2 off": ({V1: False, V2: False}, {V2: True}, {V2: "0"}),
}


def build(monkeypatch: pytest.MonkeyPatch, name: str) -> FakeIpc:
    """The fake IPC of one of :data:`BUILDS`, with its environment set (as Paddle read it at import)."""
    flags, defaults, environ = BUILDS[name]
    for flag in (V1, V2):
        monkeypatch.delenv(flag, raising=False)
    for flag, value in environ.items():
        monkeypatch.setenv(flag, value)
    return FakeIpc("cuda", flags=flags, defaults=defaults)


@pytest.mark.parametrize(
    ("name", "v1", "v2", "in_force"),
    [
        ("neither flag", None, None, None),
        ("V1 on", (True, "environment"), None, VMM_V1),
        ("V2 on by default", (False, "default"), (True, "default"), VMM_V2),
        ("V2 set by the environment", (False, "default"), (True, "environment"), VMM_V2),
        ("V2 off", (False, "default"), (False, "environment"), None),
    ],
)
def test_each_allocator_flag_is_read_from_paddle_with_whether_it_is_the_builds_default(
    monkeypatch: pytest.MonkeyPatch, name: str, v1: Any, v2: Any, in_force: Any
) -> None:
    paddle = cuda_paddle(ipc=build(monkeypatch, name))
    readings = [read_flag(paddle, flag) for flag in (VMM_V1, VMM_V2)]
    assert [None if got is None else (got.on, got.origin) for got in readings] == [v1, v2], "absent: the build lacks it"
    reading = facts_of("cuda", paddle).memory_ipc()
    assert (None if reading is None else reading.flag) is in_force


def test_a_flag_set_in_process_or_on_a_build_without_defaults_says_so() -> None:
    ipc = FakeIpc("cuda", flags={V1: False, V2: True}, defaults={V2: False})
    paddle = cuda_paddle(ipc=ipc)
    said = read_flag(paddle, VMM_V2, environ={})
    assert said is not None and said.origin == "in_process" and "paddle.set_flags" in said.said()
    paddle.base.core.globals = SimpleNamespace  # a registry without get_default
    said = read_flag(paddle, VMM_V2, environ={})
    assert said is not None and said.origin == "unknown" and "cannot say" in said.said()


def fastdeploy_export(platform: Any, layout: Any) -> Any:
    suffix = f"t{secrets.token_hex(4)}"
    with FastDeploySignal.create(CACHE_READY, suffix, layout.rank + 1):
        created = export_kv_cache(platform, layout, 2, suffix, FASTDEPLOY, 0)
        created.clear(5)
    return created


def small_layout() -> Any:
    return dataclasses.replace(qwen_layout(), rank=secrets.randbelow(900) + 100, num_layers=1)  # names of its own


@pytest.mark.parametrize(
    ("name", "flag", "origin"),
    [
        ("V1 on", V1, f"set by the environment variable {V1}"),
        ("V2 on by default", V2, "this Paddle build's default"),
        ("V2 set by the environment", V2, f"set by the environment variable {V2}"),
    ],
)
def test_a_fastdeploy_share_is_refused_before_any_export_where_a_vmm_allocator_is_on(
    monkeypatch: pytest.MonkeyPatch, name: str, flag: str, origin: str
) -> None:
    """FastDeploy's record holds a raw cudaIpcMemHandle, which covers no VMM memory of either generation."""
    ipc = build(monkeypatch, name)
    layout = small_layout()
    with pytest.raises(CacheSharingError) as caught:
        fastdeploy_export(registered("cuda", cuda_paddle(ipc=ipc)), layout)
    message = str(caught.value)
    assert f"{flag} is on ({origin})" in message and "raw cudaIpcMemHandle" in message
    assert f"Fix: set {flag}=0 in every process of the engine, before paddle is imported" in message
    assert "FastDeploy's pinned Paddle" in message and "nothing was exported" in message
    assert ipc.allocations == {} and ipc.exported_on == [], "no tensor allocated, none exported"
    assert not any(os.path.exists(f"/dev/shm/{tensor}") for tensor in layout.names())


@pytest.mark.parametrize("name", ["neither flag", "V2 off"])
def test_a_fastdeploy_share_proceeds_where_no_vmm_allocator_is_on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    ipc = build(monkeypatch, name)
    platform = registered("cuda", cuda_paddle(ipc=ipc))
    assert platform.memory_ipc() is None
    created = fastdeploy_export(platform, small_layout())
    assert created.cleared and len(ipc.exported_on) == len(ipc.allocations) == 2, "both tensors exported"


@pytest.mark.parametrize(
    ("name", "fields"), [("neither flag", 7), ("V1 on", 5), ("V2 off", 7)], ids=["neither", "V1", "V2 off"]
)
def test_our_protocol_shares_what_the_builds_ipc_covers(
    monkeypatch: pytest.MonkeyPatch, name: str, fields: int
) -> None:
    """Our manifest carries Paddle's metadata as the export gives it: VMM V1's 5 fields, or the plain 7."""
    ipc = build(monkeypatch, name)
    platform = registered("cuda", cuda_paddle(ipc=ipc))
    assert (platform.memory_ipc() is not None) is (name == "V1 on")
    shared = platform.export_cache_tensor("fd_kv.x.t", (8,), "uint8", "gpu:0")
    assert len(json.loads(shared.handle)) == fields


@pytest.mark.parametrize("name", ["V2 on by default", "V2 set by the environment"])
def test_our_protocol_refuses_vmm_v2_before_any_export_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """What Paddle's _share_cuda gives for VMM V2 memory was not seen, so no protocol of ours claims to carry it."""
    ipc = build(monkeypatch, name)
    with pytest.raises(CacheSharingError) as caught:
        facts_of("cuda", cuda_paddle(ipc=ipc)).export("fd_kv.x.t", (8,), "uint8", "gpu:0")
    message = str(caught.value)
    origin = "this Paddle build's default" if name == "V2 on by default" else f"set by the environment variable {V2}"
    assert f"Paddle's VMM V2 allocator: {V2} is on ({origin})" in message and "nothing was exported" in message
    assert f"Fix: set {V2}=0 in every process of the engine, before paddle is imported" in message
    assert ipc.allocations == {} and ipc.exported_on == []


def test_a_facts_class_naming_a_flag_the_kit_does_not_know_is_refused_naming_it() -> None:
    class Unknown(fd_platforms_cuda.CudaFacts):
        allocator_flags = ("FLAGS_use_some_future_allocator",)

    with pytest.raises(ConfigError, match=r"allocator_flags.*FLAGS_use_some_future_allocator.*one of FLAGS_use_virt"):
        Unknown(cuda_paddle(), "gpu", "CUDA_VISIBLE_DEVICES").memory_ipc()
