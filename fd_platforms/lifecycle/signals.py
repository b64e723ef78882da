"""The signals a run's engine creates for its processes, in the protocol the deployment speaks.

Ours: one cache-ready signal (:class:`~fd_platforms.ipc.cache_signal.CacheReadySignal`), whose
name the children get. FastDeploy's (``[scheduler] protocol = "fastdeploy"``): the arrays its
engine creates, under a suffix of this run's — ``cache_ready_signal``, ``swap_space_ready_signal``,
``cache_transfer_inited_signal`` (one word per rank), ``kv_cache_status`` and
``get_profile_block_num`` (one word) — and the children get the suffix.
"""

from __future__ import annotations

import os
import secrets
from contextlib import ExitStack
from types import TracebackType

from ..engine.protocol import FASTDEPLOY
from ..engine.publication import reclaim_instance
from ..ipc.cache_signal import CacheReadySignal
from ..ipc.fastdeploy_signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    PROFILE_BLOCK_NUM,
    SWAP_SPACE_READY,
    FastDeploySignal,
    segment_name,
)
from .spec import RunSpec

PER_RANK = (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED)
ONE_WORD = (KV_CACHE_STATUS, PROFILE_BLOCK_NUM)


class EngineSignals:
    """Creates the run's signals; ``name`` is what the children are given. Close removes them."""

    def __init__(self, spec: RunSpec) -> None:
        self.protocol = spec.deploy.scheduler.protocol
        self._held = ExitStack()
        if self.protocol == FASTDEPLOY:
            self.name = f"fdp{os.getpid()}-{secrets.token_hex(3)}"  # FastDeploy uses its engine's port here
            with ExitStack() as making:  # a failure part-way removes what was made
                for signal in PER_RANK:
                    making.enter_context(FastDeploySignal.create(signal, self.name, spec.ranks))
                for signal in ONE_WORD:
                    making.enter_context(FastDeploySignal.create(signal, self.name, 1))
                self._held = making.pop_all()
            self.ready_name = segment_name(CACHE_READY, self.name)
        else:
            signal = self._held.enter_context(CacheReadySignal.create(spec.ranks))
            self.name = self.ready_name = signal.name

    def describe(self) -> str:
        """For the start-up line."""
        if self.protocol == FASTDEPLOY:
            return f"FastDeploy's signals with suffix {self.name} ({self.ready_name}, ...)"
        return f"cache-ready signal {self.name}"

    def reclaim(self) -> None:
        """Remove what processes killed mid-clear left published under this run's names (ours only:
        FastDeploy's per-tensor records carry no instance, and each creator removes its own)."""
        if self.protocol != FASTDEPLOY:
            reclaim_instance(self.name)

    def close(self) -> None:
        self._held.close()

    def __enter__(self) -> EngineSignals:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
