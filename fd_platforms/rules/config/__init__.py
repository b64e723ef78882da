"""Typed, validated configuration: every record validates itself on construction, and a bad value
raises :class:`~fd_platforms.contract.errors.ConfigError` naming the field, the value, what is
allowed and the fix.

Modules: :mod:`.limits` (vocabularies and bounds), :mod:`.settings` (cache, scheduler, parallel),
:mod:`.model` (``config.json``), :mod:`.deploy` (the TOML file and overrides), :mod:`.vocabulary`
(FastDeploy's ``kv_cache_quant_type`` and ``cache_dtype`` words mapped to ours), :mod:`.nodes` (the node count,
node rank and master address of an engine over several nodes). The names below are
the package's; an engine imports those it needs from :mod:`fd_platforms.engine` (``CacheConfig``,
``ParallelConfig``, ``load_model_config``) or :mod:`fd_platforms.fastdeploy` (``cache_settings_from_fastdeploy``).
"""

from __future__ import annotations

from .deploy import DeployConfig, deploy_config_from_overrides, load_deploy_config
from .model import ModelConfig, check_tensor_parallel, load_model_config, tensor_parallel_sizes
from .settings import CacheConfig, ParallelConfig, SchedulerConfig
from .vocabulary import cache_settings_from_fastdeploy

__all__ = [
    "CacheConfig",
    "DeployConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "cache_settings_from_fastdeploy",
    "check_tensor_parallel",
    "deploy_config_from_overrides",
    "load_deploy_config",
    "load_model_config",
    "tensor_parallel_sizes",
]
