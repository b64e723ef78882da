"""The signals a run's engine creates for its processes, in the protocol the deployment speaks.

Ours: one cache-ready signal (:class:`~fd_platforms.ipc.cache_signal.CacheReadySignal`), whose
name the children get. FastDeploy's (``[scheduler] protocol = "fastdeploy"``): the arrays its
engine creates, under a suffix of this run's — ``cache_ready_signal``, ``swap_space_ready_signal``,
``cache_transfer_inited_signal`` (one word per rank), ``kv_cache_status`` and
``get_profile_block_num`` (one word, one per rank on Iluvatar; under ``--block-count-suffix`` where
given) — and the children get the suffix. The protocol's object
(:mod:`fd_platforms.engine.protocols`) makes them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from ..engine import protocol_named
from .spec import RunSpec


class EngineSignals(AbstractContextManager["EngineSignals"]):
    """Creates the run's signals; ``name`` is what the children are given. Close removes them."""

    def __init__(self, spec: RunSpec) -> None:
        self._protocol = protocol_named(spec.deploy.scheduler.protocol)
        self.name, self._held = self._protocol.create_signals(
            spec.ranks, device_type=spec.device_type, block_count_suffix=spec.block_count_suffix
        )
        self.ready_name = self._protocol.ready_signal(self.name)

    def describe(self) -> str:
        """For the start-up line."""
        return self._protocol.describe_signals(self.name)

    def reclaim(self) -> None:
        """Remove what processes killed mid-clear left published under this run's names."""
        self._protocol.reclaim(self.name)

    def __exit__(self, *exc_info: object) -> None:
        self._held.close()
