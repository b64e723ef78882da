"""fd-platforms plugin for NVIDIA CUDA GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.probes import RuntimeFacts

PLATFORM = RuntimeFacts(
    name="cuda",
    device_type="gpu",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    distributions=("paddlepaddle-gpu",),
    device_glob="/dev/nvidia[0-9]*",
    install_hint="pip install paddlepaddle-gpu (Paddle's CUDA build) on a machine with an NVIDIA GPU and driver",
    description="NVIDIA CUDA GPUs",
)

