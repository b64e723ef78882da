"""fd-platforms plugin for MetaX GPUs: device facts only, every rule lives in the core."""

from __future__ import annotations

from fd_platforms.probes import RuntimeFacts

PLATFORM = RuntimeFacts(
    name="metax",
    device_type="metax_gpu",
    visible_devices_env="MACA_VISIBLE_DEVICES",
    distributions=("paddle-metax-gpu",),
    device_glob=None,  # MetaX device nodes give no reliable count; paddle tells it
    install_hint="pip install paddle-metax-gpu beside paddlepaddle on a machine with MetaX GPUs",
    description="MetaX GPUs",
)

