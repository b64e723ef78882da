"""Whether this Paddle can place tensors on a device type: Paddle's own rule, checked on stand-ins of each
build and against the installed Paddle's own answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fd_platforms.contract.errors import DevicePlacementError, FdPlatformsError
from fd_platforms.kit.device_facts import paddle_attribute
from fd_platforms.kit.placement import PADDLE_CALLS, check_placeable, device_type_of, placeable_types


def paddle_build(*, cuda: bool = False, xpu: bool = False, custom: list[str] | None = None) -> SimpleNamespace:
    """A ``paddle`` stand-in answering the build questions as one of Paddle's builds does (custom: the
    registered custom device types; None, as Paddle's CUDA build answers with none registered)."""
    return SimpleNamespace(
        is_compiled_with_cuda=lambda: cuda,
        is_compiled_with_xpu=lambda: xpu,
        is_compiled_with_ipu=lambda: False,
        device=SimpleNamespace(get_all_custom_device_type=lambda: custom),
    )


def refusal(paddle: Any, device: str) -> DevicePlacementError:
    with pytest.raises(DevicePlacementError) as raised:
        check_placeable(paddle, device)
    return raised.value


@pytest.mark.parametrize(
    ("device", "kind"),
    [("gpu:0", "gpu"), ("GPU:1", "gpu"), ("cuda:2", "gpu"), ("cpu", "cpu"), ("iluvatar_gpu:3", "iluvatar_gpu")],
)
def test_the_device_type_is_read_as_paddle_reads_it(device: str, kind: str) -> None:
    assert device_type_of(device) == kind


def test_the_cpu_wheel_places_tensors_on_cpu_only() -> None:
    cpu_wheel = paddle_build(custom=[])
    assert placeable_types(cpu_wheel) == ("cpu",)
    check_placeable(cpu_wheel, "cpu")
    gpu = refusal(cpu_wheel, "gpu:0")
    assert (gpu.device, gpu.device_type, gpu.placeable, gpu.exit_code) == ("gpu:0", "gpu", ("cpu",), 2)
    assert isinstance(gpu, FdPlatformsError) and not isinstance(gpu, MemoryError)
    assert str(gpu).startswith("device 'gpu:0': this Paddle cannot place tensors on device type 'gpu'; it places")
    assert "Fix: install Paddle's CUDA build (pip install paddlepaddle-gpu)" in str(gpu)
    assert "Paddle's XPU build" in str(refusal(cpu_wheel, "xpu:0"))


def test_a_device_type_paddle_does_not_drive_names_the_plugin_to_install_never_fewer_blocks() -> None:
    message = str(refusal(paddle_build(custom=["nimbus_npu"]), "zephyr_tpu:0"))
    assert "device 'zephyr_tpu:0'" in message and "it places them on cpu, nimbus_npu." in message
    assert "cannot hold a KV cache through the engine API" in message
    assert "Fix: install the vendor's Paddle custom-device plugin that registers 'zephyr_tpu'" in message
    assert "fewer blocks" not in message


def test_a_build_places_tensors_on_its_own_devices_and_registered_custom_ones() -> None:
    gpu_build = paddle_build(cuda=True)  # no custom device registered: Paddle answers None
    assert placeable_types(gpu_build) == ("cpu", "gpu")
    for device in ("gpu:0", "GPU:1", "cuda:0", "cpu"):
        check_placeable(gpu_build, device)
    assert refusal(gpu_build, "xpu:0").placeable == ("cpu", "gpu")
    custom = paddle_build(xpu=True, custom=["iluvatar_gpu"])
    check_placeable(custom, "iluvatar_gpu:1")
    check_placeable(custom, "xpu:0")
    assert refusal(custom, "metax_gpu:0").placeable == ("cpu", "xpu", "iluvatar_gpu")


def test_every_call_the_check_makes_exists_in_the_installed_paddle() -> None:
    paddle = pytest.importorskip("paddle")
    missing = [name for name in PADDLE_CALLS if not callable(paddle_attribute(paddle, name))]
    assert not missing, f"the placement check calls names paddle {paddle.__version__} lacks: {missing}"


@pytest.mark.parametrize("device", ["cpu", "gpu:0", "xpu:0", "zephyr_tpu:0"])
def test_the_check_agrees_with_the_installed_paddle(device: str) -> None:
    """Refused exactly where the installed Paddle refuses to create a tensor on the device."""
    paddle = pytest.importorskip("paddle")
    try:
        paddle.zeros([1], dtype="uint8", device=device)
    except ValueError:
        placed = False
    else:
        placed = True
    try:
        check_placeable(paddle, device)
    except DevicePlacementError:
        assert not placed, f"the check refuses {device}, where this Paddle placed a tensor"
    else:
        assert placed, f"the check lets {device} through, where this Paddle refuses it"
