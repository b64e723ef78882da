"""Everything that exists because FastDeploy's own processes exist, in one package.

FastDeploy's signals (:mod:`.signals`, their failure words :mod:`.fault_words`), its per-tensor IPC records
(:mod:`.records`, :mod:`.handles`) and our marks beside them (:mod:`.marks`), its wire protocol (:mod:`.protocol`,
the rule it follows :mod:`.rule`), its config read into ours (:mod:`.config`, its values checked :mod:`.values`),
its block-count hand-off (:mod:`.block_handoff`), its RL clear/update (:mod:`.cache_status` drives it,
:mod:`.cache_server` serves it, :mod:`.weights_status` follows it). The engine (:mod:`fd_platforms.engine`) never
imports this package; importing it registers :data:`FASTDEPLOY`, so an engine call's ``protocol="fastdeploy"``
resolves (or pass ``protocol=FASTDEPLOY``). See ``docs/porting-fastdeploy.md``.
"""

from __future__ import annotations

from .block_handoff import hand_off_block_count
from .cache_server import serve_kv_cache_status
from .cache_status import (
    ClearReport,
    RestoreReport,
    UpdateReport,
    drive_kv_cache_clear,
    drive_kv_cache_restore,
    drive_kv_cache_update,
)
from .config import FastDeploySettings, from_cache_manager_args, from_fd_config
from .protocol import FASTDEPLOY
from .signals import FastDeploySignal, FastDeploySuffix, KVCacheStatus, check_suffix
from .weights_status import follow_model_weights_status

__all__ = [
    "FASTDEPLOY",
    "ClearReport",
    "FastDeploySettings",
    "FastDeploySignal",
    "FastDeploySuffix",
    "KVCacheStatus",
    "RestoreReport",
    "UpdateReport",
    "check_suffix",
    "drive_kv_cache_clear",
    "drive_kv_cache_restore",
    "drive_kv_cache_update",
    "follow_model_weights_status",
    "from_cache_manager_args",
    "from_fd_config",
    "hand_off_block_count",
    "serve_kv_cache_status",
]
