"""Which physical device a local device is: the id FastDeploy names a rank's shared tensors with.

A process sees the devices its platform's visible-devices variable lists (``CUDA_VISIBLE_DEVICES``,
``XPU_VISIBLE_DEVICES``, ``MACA_VISIBLE_DEVICES``: ``PlatformIdentity.visible_devices_env``), numbered
0, 1, ... locally. FastDeploy places a rank's tensors on local device ``gpu:{local_rank}`` but names them
``key_caches_{layer}_rank{rank}.device{id}`` with ``id`` the variable's entry for that local device:
``fastdeploy/config.py`` (``FDConfig.__init__``: ``parallel_config.device_ids`` is the variable's value,
``0,1,...`` where unset) and ``fastdeploy/worker/gpu_worker.py`` (``GpuWorker.init_device``:
``device_id=self.device_ids[self.local_rank % self.max_chips_per_node]``); its cache transfer manager,
started without the variable, sees every device and works on ``gpu:{device_id}``
(``fastdeploy/cache_manager/cache_transfer_manager.py``, ``_init_gpu_cache``). So two engines on one host
(``CUDA_VISIBLE_DEVICES=0,1`` and ``4,5``) name different tensors though both place them on local 0 and 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..contract.errors import ConfigError
from ..contract.integers import INT32_MAX, check_int, decimal
from ..contract.types import PlatformIdentity


def physical_device_id(identity: PlatformIdentity, local_device: int, environ: Mapping[str, str] | None = None) -> int:
    """The physical id of local device ``local_device``: the ``local_device``-th entry of the platform's
    visible-devices variable in ``environ`` (default ``os.environ``), or ``local_device`` itself where the
    platform has no such variable or it is unset (every device visible, as FastDeploy's default list).

    A variable whose entries are not device indices (a UUID, an empty entry), or that lists fewer devices
    than ``local_device + 1``, is a ConfigError naming the variable, its value and the fix.
    """
    check_int("local_device", local_device, 0, INT32_MAX, fix="pass the local device index (0 for the first visible)")
    variable = identity.visible_devices_env
    value = None if variable is None else (os.environ if environ is None else environ).get(variable)
    if variable is None or value is None:
        return local_device
    return listed_device(
        variable,
        value,
        local_device,
        (
            f"list the devices by index in {variable} (not by UUID, no empty entries), or unset it",
            f"list one device per local rank in {variable}, or use fewer ranks",
        ),
    )


def listed_device(field: str, value: str, local_device: int, fixes: tuple[str, str]) -> int:
    """The ``local_device``-th entry of ``value``, a comma-separated list of device indices read from ``field``
    (a visible-devices variable, or FastDeploy's ``parallel_config.device_ids`` that copies one). A list that is
    not of indices, or too short, is a ConfigError naming ``field`` and its value, with ``fixes`` (for each)."""
    entries = [entry.strip() for entry in value.split(",")]
    if any(decimal(entry, INT32_MAX) is None for entry in entries):
        raise ConfigError(
            field,
            value,
            "comma-separated device indices (4,5): FastDeploy names a rank's shared tensors with them",
            fixes[0],
        )
    if local_device >= len(entries):
        raise ConfigError(
            field, value, f"at least {local_device + 1} device(s): local device {local_device} must be listed", fixes[1]
        )
    return int(entries[local_device])
