"""fd-platforms plugin for Hygon DCUs on Paddle's ROCm build: device facts only, every rule lives in the core.

Paddle's ROCm build is no custom device: it drives the DCU as ``gpu`` (FastDeploy e53f5184 selects it
by ``is_compiled_with_rocm()`` before CUDA, ``fastdeploy/platforms/__init__.py:39``, and its
``DCUModelRunner`` inherits the GPU runner, ``fastdeploy/worker/dcu_model_runner.py:24``), read through
the kit's ``RocmFacts``. It cannot share a cache tensor between processes (``RocmFacts.no_sharing``),
so a worker the rule sends to attach is refused when it decides.
"""

from __future__ import annotations

from fd_platforms.plugin import PaddlePlatform, RocmFacts

PLATFORM = PaddlePlatform(
    name="dcu",
    device_type="gpu",
    visible_devices_env="HIP_VISIBLE_DEVICES",  # the HIP runtime's own variable
    distributions=("paddlepaddle-dcu",),
    device_glob=None,  # /dev/kfd is one node for every device, /dev/dri render nodes are any vendor's
    # (FastDeploy's docs/get_started/installation/hygon_dcu.md:26-27 mounts both)
    install_hint="pip install paddlepaddle-dcu (Paddle's ROCm build) on a machine with Hygon DCUs and the DTK driver",
    api_versions=">=1.0,<2",
    description="Hygon DCUs (Paddle's ROCm build)",
    facts=RocmFacts,
)
