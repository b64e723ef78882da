"""fd-platforms plugin for Kunlun XPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.probes import RuntimeFacts

PLATFORM = RuntimeFacts(
    name="xpu",
    device_type="xpu",
    visible_devices_env="XPU_VISIBLE_DEVICES",
    distributions=("paddlepaddle-xpu",),
    device_glob="/dev/xpu[0-9]*",
    install_hint="pip install paddlepaddle-xpu (Paddle's Kunlun build) on a machine with Kunlun XPUs",
    description="Kunlun XPUs",
)

