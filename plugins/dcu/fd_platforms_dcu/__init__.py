"""fd-platforms plugin for Hygon DCUs on Paddle's ROCm build: device facts only, every rule lives in the core.

Paddle's ROCm build is no custom device: it drives the DCU as ``gpu`` (FastDeploy's ``DCUModelRunner``
inherits its GPU runner), read through the kit's ``RocmFacts``. It cannot share a cache tensor between
processes (``RocmFacts.no_sharing``), so a worker the rule sends to attach is refused when it decides.
"""

from __future__ import annotations

from fd_platforms.plugin import PaddlePlatform, RocmFacts

PLATFORM = PaddlePlatform(
    name="dcu",
    device_type="gpu",
    visible_devices_env="HIP_VISIBLE_DEVICES",  # HIP's variable; CUDA_VISIBLE_DEVICES is not HIP's
    distributions=("paddlepaddle-dcu",),
    device_glob=None,  # /dev/kfd is one node for every device, /dev/dri render nodes are any vendor's
    install_hint="pip install paddlepaddle-dcu (Paddle's ROCm build) on a machine with Hygon DCUs and the DTK driver",
    api_versions=">=1.6,<2",  # 1.6: RocmFacts in fd_platforms.plugin
    description="Hygon DCUs (Paddle's ROCm build)",
    facts=RocmFacts,
)
