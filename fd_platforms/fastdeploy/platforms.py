"""Our platform for the one FastDeploy selected (``fastdeploy.platforms.current_platform``).

FastDeploy picks its platform from Paddle's build, not from an environment variable
(``fastdeploy/platforms/__init__.py`` ``__getattr__``, develop c1b7c083: ROCm, CUDA, XPU, then the custom devices
npu, intel_hpu, iluvatar_gpu, gcu, metax_gpu, else cpu). Each platform class names itself with ``device_name``
(``fastdeploy/platforms/cuda.py`` ``CUDAPlatform.device_name = "gpu"``, ``maca.py`` ``MACAPlatform`` ``"metax_gpu"``,
...). A port reads that name from FastDeploy's object, duck-typed (nothing of FastDeploy is imported), and runs
on the fd-platforms platform of the same hardware, so the two never disagree about the device.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from ..contract.errors import ConfigError
from ..loading.platform import Platform
from ..loading.selection import ENV_PLATFORM, select_platform

FASTDEPLOY_PLATFORMS: dict[str, str] = {
    "gpu": "cuda",  # platforms/cuda.py CUDAPlatform
    "dcu": "dcu",  # platforms/dcu.py DCUPlatform (Paddle's ROCm build)
    "xpu": "xpu",  # platforms/xpu.py XPUPlatform (Kunlun)
    "iluvatar_gpu": "iluvatar",  # platforms/iluvatar.py IluvatarPlatform
    "metax_gpu": "metax",  # platforms/maca.py MACAPlatform
    "gcu": "gcu",  # platforms/gcu.py GCUPlatform
    "intel_hpu": "intel_hpu",  # platforms/intel_hpu.py INTEL_HPUPlatform
    "npu": "npu",  # platforms/npu.py NPUPlatform
    "cpu": "cpu",  # platforms/cpu.py CPUPlatform
}
"""FastDeploy's platform ``device_name`` → the fd-platforms platform of the same hardware."""

_FIELD = "current_platform.device_name"
_lock = threading.Lock()
_selected: dict[str, Platform] = {}


def our_platform_name(current_platform: object) -> str:
    """The fd-platforms platform name for FastDeploy's ``current_platform`` (read by its ``device_name``); a
    ConfigError naming ``current_platform.device_name`` for one this table does not know."""
    name = getattr(current_platform, "device_name", None)
    if not isinstance(name, str) or name not in FASTDEPLOY_PLATFORMS:
        shown = name if name is not None else f"{type(current_platform).__name__} without device_name"
        raise ConfigError(
            _FIELD,
            shown,
            "one of FastDeploy's platforms: " + ", ".join(FASTDEPLOY_PLATFORMS),
            "pass fastdeploy.platforms.current_platform itself (its class sets device_name); for a platform "
            f"FastDeploy added later, set {ENV_PLATFORM} and use fd_platforms.current_platform()",
        )
    return FASTDEPLOY_PLATFORMS[name]


def our_platform(current_platform: object, *, environ: Mapping[str, str] | None = None) -> Platform:
    """The fd-platforms :class:`~fd_platforms.loading.platform.Platform` for FastDeploy's ``current_platform``:
    its plugin selected by name, as ``FD_PLATFORM=<name>`` selects it (loaded, detected and confirmed; an
    error naming the plugin to install where it is missing or cannot run here), once per process.

    ``FD_PLATFORM`` (in ``environ``, default this process's) naming another platform is a ConfigError: the
    engine's processes would then disagree about the device."""
    name = our_platform_name(current_platform)
    env = dict(os.environ if environ is None else environ)
    requested = env.get(ENV_PLATFORM)
    if requested and requested != name:
        raise ConfigError(
            ENV_PLATFORM,
            requested,
            f"unset, or {name!r}: FastDeploy runs on {getattr(current_platform, 'device_name', name)!r} "
            f"({type(current_platform).__name__})",
            f"unset {ENV_PLATFORM}, or set it to {name}, in FastDeploy's processes",
        )
    with _lock:
        if name not in _selected:
            _selected[name] = select_platform({**env, ENV_PLATFORM: name}).platform
        return _selected[name]


__all__ = ["FASTDEPLOY_PLATFORMS", "our_platform", "our_platform_name"]
