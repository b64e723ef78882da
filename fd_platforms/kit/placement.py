"""Whether this Paddle can place tensors on a device: checked before the engine allocates a KV cache there.

Paddle's own rule, as its device-string parser applies it (``paddle.base.framework._get_paddle_place``,
which ``paddle.zeros(device=...)`` calls; Paddle 3.3): the type is the string before ``:``, lowercased,
``cuda`` read as ``gpu``; ``cpu`` always; ``gpu`` only where ``paddle.is_compiled_with_cuda()``, ``xpu``
only where ``paddle.is_compiled_with_xpu()``, ``ipu`` only where ``paddle.is_compiled_with_ipu()``; any
other type only where ``paddle.device.get_all_custom_device_type()`` lists it (a custom-device plugin
registered it). Paddle's CPU wheel answers False to each build question and ``[]`` for the custom types.
"""

from __future__ import annotations

from typing import Any

from ..contract.errors import DevicePlacementError

BUILDS = {
    "gpu": ("is_compiled_with_cuda", "install Paddle's CUDA build (pip install paddlepaddle-gpu)"),
    "xpu": ("is_compiled_with_xpu", "install Paddle's XPU build (pip install paddlepaddle-xpu)"),
    "ipu": ("is_compiled_with_ipu", "install Paddle's IPU build"),
}
"""Device types Paddle's own builds drive: the build question Paddle asks, and the fix where it says no."""
PADDLE_CALLS = (*(call for call, _ in BUILDS.values()), "device.get_all_custom_device_type")
"""Every Paddle call the check makes (a test holds them to the installed Paddle)."""


def device_type_of(device: str) -> str:
    """The device type of a Paddle device string, as Paddle reads it (``GPU:1`` and ``cuda:1`` -> ``gpu``)."""
    kind = device.split(":", 1)[0].lower()
    return "gpu" if kind == "cuda" else kind


def placeable_types(paddle: Any) -> tuple[str, ...]:
    """The device types this Paddle places tensors on: cpu, its build's accelerators, its custom devices."""
    built = [kind for kind, (call, _) in BUILDS.items() if getattr(paddle, call)()]
    return ("cpu", *built, *(paddle.device.get_all_custom_device_type() or ()))


def check_placeable(paddle: Any, device: str) -> None:
    """Pass where this Paddle can place tensors on ``device``; else raise
    :class:`~fd_platforms.contract.errors.DevicePlacementError` naming the device, the types this Paddle places tensors
    on and what to install."""
    kind = device_type_of(device)
    placeable = placeable_types(paddle)
    if kind in placeable:
        return
    if kind in BUILDS:
        fix = BUILDS[kind][1]
    else:
        fix = (
            f"install the vendor's Paddle custom-device plugin that registers {kind!r} (or point CUSTOM_DEVICE_ROOT "
            "at the folder holding its runtime library)"
        )
    raise DevicePlacementError(device, kind, placeable, fix)
