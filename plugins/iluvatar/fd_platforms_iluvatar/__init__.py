"""fd-platforms plugin for Iluvatar CoreX GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.probes import RuntimeFacts

PLATFORM = RuntimeFacts(
    name="iluvatar",
    device_type="iluvatar_gpu",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    distributions=("paddle-iluvatar-gpu",),
    device_glob="/dev/iluvatar[0-9]*",
    install_hint="pip install paddle-iluvatar-gpu beside paddlepaddle on a machine with Iluvatar GPUs",
    description="Iluvatar CoreX GPUs",
)

