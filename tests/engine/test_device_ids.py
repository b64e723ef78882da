"""Two device ids: the physical id that names a rank's shared tensors, and the local device they live on.

FastDeploy names ``key_caches_{layer}_rank{rank}.device{id}`` with the visible-devices variable's entry
for the local device, but places the tensor on ``gpu:{local_rank}`` (``fastdeploy/config.py``
``FDConfig.__init__``, ``fastdeploy/worker/gpu_worker.py`` ``GpuWorker.init_device``). On the fake custom
device the same is shown end to end in tests/plugins/test_fake_device_ids.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fd_platforms.contract.errors import ConfigError
from fd_platforms.contract.types import DeviceMemory, PlatformIdentity
from fd_platforms.lifecycle.spec import RunSpec, run_device_ids
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, SchedulerConfig, load_model_config
from fd_platforms.rules.config.deploy import DeployConfig
from fd_platforms.rules.devices import physical_device_id
from fd_platforms.rules.layout import build_layout

QWEN = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b"
GPU = PlatformIdentity("cuda", "gpu", "CUDA_VISIBLE_DEVICES")
CPU = PlatformIdentity("cpu", "cpu", None)


def test_the_physical_id_is_the_visible_devices_entry_of_the_local_device() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert [physical_device_id(GPU, local, env) for local in (0, 1)] == [4, 5]
    assert physical_device_id(GPU, 1, {"CUDA_VISIBLE_DEVICES": " 6 , 3 "}) == 3


def test_without_a_visible_devices_variable_the_physical_id_is_the_local_device() -> None:
    assert physical_device_id(GPU, 3, {}) == 3  # unset: every device visible (FastDeploy's 0,1,... default)
    assert physical_device_id(CPU, 0, {"CUDA_VISIBLE_DEVICES": "4"}) == 0  # the platform has no variable


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("GPU-1f2e,GPU-3a4b", "comma-separated device indices"),
        ("", "comma-separated device indices"),
        ("4,,5", "comma-separated device indices"),
        ("4", "at least 2 device(s)"),
    ],
)
def test_a_bad_visible_devices_variable_is_a_config_error_naming_it(value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        physical_device_id(GPU, 1, {"CUDA_VISIBLE_DEVICES": value})
    message = str(caught.value)
    assert message.startswith(f"CUDA_VISIBLE_DEVICES={value!r} is not valid; allowed: {allowed}"), message
    assert "Fix: " in message and caught.value.field == "CUDA_VISIBLE_DEVICES"


def test_a_layout_names_its_tensors_with_the_physical_id_and_lives_on_the_local_device() -> None:
    model = load_model_config(QWEN)
    layout = build_layout(model, CacheConfig(), ParallelConfig(2, 1), device_id=5, local_device=1)
    assert layout.names()[:2] == ("key_caches_0_rank1.device5", "value_caches_0_rank1.device5")
    assert (layout.device_id, layout.local_device) == (5, 1)
    assert build_layout(model, CacheConfig(), ParallelConfig(2, 1), device_id=1).local_device == 1  # today's default
    with pytest.raises(ConfigError, match="local_device=-1 is not valid"):
        build_layout(model, CacheConfig(), ParallelConfig(2, 1), device_id=5, local_device=-1)


def test_planning_reads_the_facts_of_the_device_the_tensors_live_on(
    make_plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_plugin("twodevices")  # a device platform: on cpu a plan without memory= is refused (the host is the device)
    platform = select_platform({"FD_PLATFORM": "twodevices"}).platform
    asked: list[int] = []

    def device_memory(device_id: int = 0) -> DeviceMemory:
        asked.append(device_id)
        return DeviceMemory(2**34, 2**34, 0, "stand-in")

    monkeypatch.setattr(platform, "device_memory", device_memory)
    layout = build_layout(load_model_config(QWEN), CacheConfig(), ParallelConfig(2, 1), device_id=5, local_device=1)
    platform.max_num_blocks(layout=layout, cache=CacheConfig(), non_cache_bytes=0, host_memory=2**40)
    platform.max_num_blocks(layout=layout, cache=CacheConfig(), device_id=0, non_cache_bytes=0, host_memory=2**40)
    assert asked == [1, 0]


def test_a_run_names_each_rank_by_its_visible_device_and_places_it_on_its_local_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    model = load_model_config(QWEN)
    deploy = DeployConfig(QWEN, model, CacheConfig(), SchedulerConfig(), ParallelConfig(2))
    spec = RunSpec(deploy, "cuda", "gpu", 2, timeout=5.0, device_ids=run_device_ids(GPU, 2))
    assert [spec.layout(rank).names()[0] for rank in (0, 1)] == [
        "key_caches_0_rank0.device4",
        "key_caches_0_rank1.device5",
    ]
    assert [(spec.device_id(rank), spec.local_device(rank)) for rank in (0, 1)] == [(4, 0), (5, 1)]
    assert run_device_ids(CPU, 2) == ()  # cpu: every rank on the host
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES='4' is not valid; allowed: at least 2 device"):
        run_device_ids(GPU, 2)
