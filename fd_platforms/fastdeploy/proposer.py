"""The MTP proposer's settings, from its runner's.

FastDeploy's MTP proposer holds its own FDConfig: a deep copy of the runner's (``fastdeploy/spec_decode/base.py``
``Proposer.__init__``) in which ``_update_mtp_config`` (``spec_decode/mtp.py``, develop c1b7c083) sets
``model_config.num_hidden_layers = 1``, ``start_layer_index`` to the main model's layer count and
``speculative_config.model_type = "mtp"``. Read as a model, that copy is a one-layer model, so
:func:`~fd_platforms.fastdeploy.config.from_fd_config` refuses it; the proposer's cache is the draft part of its
runner's layout (layers numbered after the main model's, ``int(blocks * num_gpu_block_expand_ratio)`` blocks
each), and :func:`proposer_settings` takes it from the runner's settings, checking the proposer's copy against
them where it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..contract.errors import ConfigError
from ..engine.request import CacheRequest
from ..rules.layout import CacheLayout
from .config import FastDeploySettings

_FIX = "pass the runner's settings (from_fd_config of the runner's FDConfig) and the proposer's own fd_config"


@dataclass(frozen=True)
class ProposerSettings:
    """What FastDeploy's MTP proposer needs for its cache: its runner's settings, and from them the draft part."""

    runner: FastDeploySettings

    def layout(self) -> CacheLayout:
        """The proposer's layout: the draft part of the runner's whole layout."""
        return self.runner.layout().draft()

    def cache_request(self, num_blocks: int, *, profile: bool = False, **fields: Any) -> CacheRequest:
        """The proposer's :class:`~fd_platforms.engine.CacheRequest` for ``initialize_kv_cache``: the draft part with
        the runner's ``num_blocks``, rule inputs, protocol and instance (one rank, one rule, one slot); ``fields`` any
        other field of the record (``creator_pid``, ``timeout``, ``tensor_specs``)."""
        return self.runner.cache_request(self.layout(), num_blocks, profile=profile, **fields)


def proposer_settings(runner: FastDeploySettings, proposer_fd_config: object | None = None) -> ProposerSettings:
    """The MTP proposer's settings from its ``runner``'s (:func:`~fd_platforms.fastdeploy.config.from_fd_config` of
    the runner's FDConfig). ``proposer_fd_config``, the proposer's own deep copy where given, must be that
    runner's: ``num_hidden_layers`` its draft layers, ``start_layer_index`` its main layers. A ConfigError naming
    the attribute otherwise, or where the runner has no MTP layers (``speculative_config.method`` is not ``mtp``)."""
    if not isinstance(runner, FastDeploySettings):
        raise ConfigError("runner", runner, "the runner's FastDeploySettings", _FIX)
    whole = runner.layout()
    if not whole.mtp_layers:
        raise ConfigError(
            "fd_config.speculative_config.method",
            None,
            "mtp: the runner's layout has no draft layers for a proposer",
            "pass the settings of a runner whose FDConfig uses MTP",
        )
    if proposer_fd_config is not None:
        model = getattr(proposer_fd_config, "model_config", None)
        main = whole.num_layers - whole.mtp_layers
        for name, expected in (("num_hidden_layers", whole.mtp_layers), ("start_layer_index", main)):
            found = getattr(model, name, None)
            if found != expected:
                raise ConfigError(
                    f"proposer.fd_config.model_config.{name}",
                    found,
                    f"{expected}, as the proposer's copy of this runner's FDConfig holds it "
                    "(mtp.py _update_mtp_config)",
                    _FIX,
                )
    return ProposerSettings(runner)


__all__ = ["ProposerSettings", "proposer_settings"]
