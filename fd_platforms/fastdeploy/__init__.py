"""Everything that exists because FastDeploy's own processes exist, in one package.

FastDeploy's signals (:mod:`.signals`, their failure words :mod:`.fault_words`), its per-tensor IPC records
(:mod:`.records`, :mod:`.handles`) and our marks beside them (:mod:`.marks`), its wire protocol (:mod:`.protocol`,
the rule it follows :mod:`.rule`), its config read into ours (:mod:`.config`, its values checked :mod:`.values`),
its block-count hand-off (:mod:`.block_handoff`), its RL clear/update (:mod:`.cache_status` drives it,
:mod:`.cache_server` serves it, :mod:`.weights_status` follows it), its control path's sleep and wakeup
(:mod:`.control` serves it over :mod:`.control_wire`, reading :mod:`.control_pickles`; :mod:`.runner_sleep` is our
runner's side), and what a port of FastDeploy would otherwise
write itself: our platform for its ``current_platform`` (:mod:`.platforms`), its attention backend's shapes as our
tensor specs (:mod:`.backend_shapes`), its profiled budget as a plan (:mod:`.profile_budget`), the MTP proposer's
settings from its runner's (:mod:`.proposer`), a managed cache in the views its cache processes keep
(:mod:`.cache_views`) and the rule its release follows (:data:`~fd_platforms.fastdeploy.rule.FASTDEPLOY_RULE`). The
engine (:mod:`fd_platforms.engine`) never imports this package; importing it registers
:data:`~fd_platforms.fastdeploy.protocol.FASTDEPLOY`, so an engine call's ``protocol="fastdeploy"`` resolves (or pass
``protocol=FASTDEPLOY``). Beside them, two rules of ours stated in FastDeploy's terms: its cache words read into our
cache settings (``cache_settings_from_fastdeploy``) and the physical device id it names a rank's tensors with
(``physical_device_id``). An engine beside FastDeploy imports from here, from
:mod:`fd_platforms.engine` and from :mod:`fd_platforms`. See ``docs/porting-fastdeploy.md``.
"""

from __future__ import annotations

from ..rules.config import cache_settings_from_fastdeploy
from ..rules.devices import physical_device_id
from .backend_shapes import backend_tensor_specs, tensor_specs_from_shapes
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
from .cache_views import messager_cache_kvs, transfer_manager_views
from .config import FastDeploySettings, from_cache_manager_args, from_fd_config
from .control import serve_control_requests
from .control_wire import ControlPlace
from .platforms import FASTDEPLOY_PLATFORMS, our_platform, our_platform_name
from .profile_budget import ProfiledBudget, num_blocks_for, plan_from_profile, profile_cache_bytes
from .proposer import ProposerSettings, proposer_settings
from .protocol import FASTDEPLOY
from .rule import FASTDEPLOY_RULE
from .runner_sleep import SleepingKVCache
from .signals import FastDeploySignal, FastDeploySuffix, KVCacheStatus, check_suffix
from .weights_status import follow_model_weights_status

__all__ = [
    "FASTDEPLOY",
    "FASTDEPLOY_PLATFORMS",
    "FASTDEPLOY_RULE",
    "ClearReport",
    "ControlPlace",
    "FastDeploySettings",
    "FastDeploySignal",
    "FastDeploySuffix",
    "KVCacheStatus",
    "ProfiledBudget",
    "ProposerSettings",
    "RestoreReport",
    "SleepingKVCache",
    "UpdateReport",
    "backend_tensor_specs",
    "cache_settings_from_fastdeploy",
    "check_suffix",
    "drive_kv_cache_clear",
    "drive_kv_cache_restore",
    "drive_kv_cache_update",
    "follow_model_weights_status",
    "from_cache_manager_args",
    "from_fd_config",
    "hand_off_block_count",
    "messager_cache_kvs",
    "num_blocks_for",
    "our_platform",
    "our_platform_name",
    "physical_device_id",
    "plan_from_profile",
    "profile_cache_bytes",
    "proposer_settings",
    "serve_control_requests",
    "serve_kv_cache_status",
    "tensor_specs_from_shapes",
    "transfer_manager_views",
]
