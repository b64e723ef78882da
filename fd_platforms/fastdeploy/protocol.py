"""FastDeploy's own protocol, spoken beside its unmodified processes (``protocol="fastdeploy"``).

=================== ===============================================================================
step                speaks
=================== ===============================================================================
``instance=``       FastDeploy's signal suffix (its engine's ``engine_worker_queue_port``)
cache ready         ``cache_ready_signal.<suffix>``, one int32 per rank
                    (:mod:`fd_platforms.fastdeploy.signals`)
tensors published   one ``set_data_ipc`` record per tensor, named as the layout names it
                    (:mod:`fd_platforms.fastdeploy.handles`)
attacher lets go    resets its ``cache_ready_signal`` slot to 0
cache manager up    ``swap_space_ready_signal`` (with swap space), ``cache_transfer_inited_signal``
block count         ``get_profile_block_num`` under its own suffix, one word (one per rank on
                    Iluvatar) (:mod:`fd_platforms.fastdeploy.block_handoff`)
RL clear/update     ``model_weights_status`` and ``kv_cache_status``, two events
                    (:mod:`fd_platforms.fastdeploy.weights_status`, :mod:`fd_platforms.fastdeploy.cache_status`)
the rule            no word: pinned where FastDeploy's releases disagree (:mod:`.rule`)
=================== ===============================================================================

FastDeploy's side: its runner creates and attaches in ``fastdeploy/worker/gpu_model_runner.py``
(``initialize_kv_cache``); its cache transfer manager, ``fastdeploy/cache_manager/cache_transfer_manager.py``,
sets the two manager words, which its engine waits for before it starts its cache service.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from ..contract.errors import CacheSharingError, ConfigError
from ..engine.protocols import WireProtocol
from ..engine.publication import PublishedTensor
from ..ipc import shm
from ..ipc.cache_signal import resolve_timeout
from ..ipc.shared_words import MAX_LOCAL_RANKS, WORD_BYTES
from .block_handoff import block_count_words, hand_off_block_count
from .handles import FastDeployHandles
from .marks import sweep_orphan_marks
from .rule import mismatch_hint, rule_in_force
from .signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    PER_RANK,
    PROFILE_BLOCK_NUM,
    SWAP_SPACE_READY,
    FastDeploySignal,
    FastDeploySuffix,
    check_suffix,
    segment_name,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..loading.platform import Platform
    from ..rules.decision import DecisionInputs
    from ..rules.layout import CacheLayout

#: Every signal a run's engine creates under its suffix (``get_profile_block_num`` where no engine's suffix is given).
RUN_SIGNALS = (*PER_RANK, KV_CACHE_STATUS, PROFILE_BLOCK_NUM)
RUN_SUFFIX = r"fdp(\d+)-[0-9a-f]{6}"  # a run's suffix: its engine's pid and three random bytes
LEFTOVER = "FastDeploy signal of an fd-platforms run"


class FastDeployProtocol(WireProtocol):
    """FastDeploy's signals and per-tensor records; see the module docstring."""

    name = "fastdeploy"

    def check_instance(self, instance: object) -> None:
        check_suffix(instance, "instance")

    def instance_name(self, instance: object, *, tp: int | None) -> str:
        """FastDeploy's signal suffix (its engine's ``engine_worker_queue_port``; an int is taken as written),
        carrying ``tp`` (:class:`~.signals.FastDeploySuffix`)."""
        if instance is None:
            raise ConfigError(
                "instance",
                None,
                "FastDeploy's signal suffix (its engine's engine_worker_queue_port)",
                "pass instance=, e.g. instance=9923",
            )
        return FastDeploySuffix.of(instance, tp=tp, field="instance")

    def tensor_name(self, instance: str, layout_name: str) -> str:
        return layout_name  # FastDeploy's records are named as its layout names the tensors

    def set_ready(self, instance: str, rank: int) -> None:
        self._write(CACHE_READY, instance, rank, 1)

    def clear_ready(self, instance: str, rank: int) -> None:
        """The attacher's let-go (and a creator's clear)."""
        self._write(CACHE_READY, instance, rank, 0)

    def check_signals(self, instance: str, rank: int, *, manager: bool, swap: bool) -> None:
        """``cache_ready_signal``, and a manager's ``swap_space_ready_signal`` (with swap space) and
        ``cache_transfer_inited_signal``: each must exist and have ``rank``'s slot."""
        names = (
            CACHE_READY,
            *((SWAP_SPACE_READY,) if manager and swap else ()),
            *((CACHE_TRANSFER_INITED,) if manager else ()),
        )
        for name in names:
            with FastDeploySignal.attach(name, instance) as signal:
                signal.get(rank)

    def check_export(self, platform: Platform, device: str) -> None:
        """FastDeploy's record holds a raw 64-byte ``cudaIpcMemHandle`` (its ``set_data_ipc`` calls
        ``cudaIpcGetMemHandle``), which covers no memory of Paddle's VMM allocators, of either generation: refused
        where one is on in this process, naming the flag and whether it is the build's default."""
        in_force = platform.memory_ipc()
        if in_force is None:
            return
        raise CacheSharingError(
            f"platform {platform.name}'s KV cache on {device} would live in Paddle's {in_force.flag.generation} "
            f"allocator: {in_force.said()}. FastDeploy's record holds a raw cudaIpcMemHandle, which covers no VMM "
            f"memory, so nothing was exported. Fix: {in_force.fix()}; or use FastDeploy's pinned Paddle (its #8108), "
            "whose default allocator is not VMM"
        )

    @staticmethod
    def _write(name: str, instance: str, rank: int, value: int) -> None:
        """Word ``rank`` of signal ``name`` under ``instance`` set to ``value``."""
        with FastDeploySignal.attach(name, instance) as signal:
            signal.set(rank, value)

    def rule_in_force(self, rule: str | None, inputs: DecisionInputs, field: str = "rule") -> str:
        return rule_in_force(rule, inputs, field)

    def wait_limit(self, timeout: float | None) -> float:
        """As FastDeploy's processes wait (``gpu_model_runner.py`` ``initialize_kv_cache`` polls
        ``cache_ready_signal`` and ``clear_cache`` its let-go with no limit): for ever, unless ``timeout`` or
        ``FD_CACHE_READY_TIMEOUT`` says otherwise. Where the process waited for is known (``creator_pid``, an attacher's
        mark), its death still ends the wait at once."""
        return resolve_timeout(timeout, default=math.inf)

    def rule_mismatch(self, rule: str, inputs: DecisionInputs) -> str:
        return mismatch_hint(rule, inputs)

    def wait_ready(
        self, platform: Platform, instance: str, rank: int, timeout: float | None, creator_pid: int | None
    ) -> float:
        """Watched by the core itself: FastDeploy's writers wake nobody (see :mod:`fd_platforms.fastdeploy.signals`)."""
        with FastDeploySignal.attach(CACHE_READY, instance) as signal:
            return signal.wait_for(
                rank,
                1,
                self.wait_limit(timeout),
                watch_pid=creator_pid,
                what=f"rank {rank} waiting for its KV cache",
                writer="the process creating it (FastDeploy's cache transfer manager or runner)",
            )

    def part_record(self, instance: str, layout: CacheLayout) -> str:
        """The record of the part's first tensor (each tensor has its own, named by its layer)."""
        return self.tensor_name(instance, layout.names()[0])

    def publish(
        self,
        instance: str,
        rank: int,
        device: str,
        tensors: Sequence[PublishedTensor],
        platform_name: str,
        *,
        attachers: int,
        part: str = "all",
        beside_messager: bool = False,
    ) -> FastDeployHandles:
        """One record per tensor, named by its layer: a draft part's records are its own whatever ``part``."""
        return FastDeployHandles.create(
            instance, rank, tensors, platform_name, attachers=attachers, beside_messager=beside_messager
        )

    def open_published(
        self,
        instance: str,
        rank: int,
        expected: Sequence[PublishedTensor],
        platform_name: str,
        part: str = "all",
        *,
        attachers: int = 1,
        beside_messager: bool = False,
    ) -> FastDeployHandles:
        return FastDeployHandles.open(  # no shapes
            instance, rank, expected, platform_name, attachers=attachers, beside_messager=beside_messager
        )

    def manager_up(self, instance: str, rank: int, *, swap: bool) -> None:
        """Say so as FastDeploy's transfer manager does: ``swap_space_ready_signal`` where it holds swap
        space, then ``cache_transfer_inited_signal``."""
        if swap:
            self._write(SWAP_SPACE_READY, instance, rank, 1)
        self._write(CACHE_TRANSFER_INITED, instance, rank, 1)

    def manager_swap_freed(self, instance: str, rank: int) -> None:
        """Reset ``swap_space_ready_signal``, as FastDeploy's transfer manager does."""
        self._write(SWAP_SPACE_READY, instance, rank, 0)

    def hand_off_block_count(
        self, instance: str, num_blocks: int, *, block_count_suffix: str | None, platform: Platform, ranks: int
    ) -> str:
        """FastDeploy's engine waits for this word before it sizes its block tables."""
        return hand_off_block_count(
            instance, num_blocks, block_count_suffix=block_count_suffix, platform=platform, ranks=ranks
        )

    def create_signals(self, ranks: int, *, device_type: str, block_count_suffix: str | None) -> tuple[str, ExitStack]:
        """The arrays FastDeploy's engine creates, under a suffix of this run's (FastDeploy's is its
        engine's port), ``get_profile_block_num`` under its own suffix and as long as FastDeploy's
        engine makes it (:mod:`fd_platforms.fastdeploy.block_handoff`); a failure part-way removes what was made.
        What killed runs left first goes (:func:`sweep_dead_runs`)."""
        sweep_dead_runs()
        suffix = f"fdp{os.getpid()}-{secrets.token_hex(3)}"
        with ExitStack() as making:
            for signal in PER_RANK:
                making.enter_context(FastDeploySignal.create(signal, suffix, ranks))
            making.enter_context(FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1))
            words = block_count_words(device_type, ranks)
            making.enter_context(FastDeploySignal.create(PROFILE_BLOCK_NUM, block_count_suffix or suffix, words))
            return suffix, making.pop_all()

    def ready_signal(self, instance: str) -> str:
        return segment_name(CACHE_READY, instance)

    def describe_signals(self, instance: str) -> str:
        return f"engine instance {instance}: FastDeploy's signals ({self.ready_signal(instance)}, ...)"

    def reclaim(self, instance: str) -> None:
        """Nothing: FastDeploy's per-tensor records carry no instance, and each creator removes its own."""


def sweep_dead_runs() -> list[str]:
    """Remove the signals of our runs that died (a SIGKILLed engine cannot remove its own); the names removed.

    Only what is provably ours and dead goes: FastDeploy's signal names under a run's suffix
    (``fdp<pid>-<hex>``), the size such a signal has, this user's, and no lock held
    (:func:`fd_platforms.ipc.shm.sweep` proves the last two: a living run's engine holds a shared
    ``flock`` on each signal it made, dropped by the kernel at its death). FastDeploy's own signals
    (its port's suffix) and another user's are never touched."""
    removed: list[str] = []
    for signal in RUN_SIGNALS:
        removed += shm.sweep(f"{signal}.fdp", WORD_BYTES, _run_signal(signal), LEFTOVER)
    return removed + sweep_orphan_marks()  # its attachers' marks, where the run's slots are gone


def _run_signal(signal: str) -> shm.Recognise:
    """Says whether a segment is ``signal`` of one of our runs: the run's engine pid (for messages), or None."""
    name = re.compile(rf"{re.escape(signal)}\.{RUN_SUFFIX}")
    words = 1 if signal == KV_CACHE_STATUS else MAX_LOCAL_RANKS

    def recognise(segment: shm.Segment) -> str | None:
        found = name.fullmatch(segment.name)
        if found is None or segment.size % WORD_BYTES or not 1 <= segment.size // WORD_BYTES <= words:
            return None
        return f"the run with engine pid {found.group(1)}"

    return recognise


#: FastDeploy's wire protocol (``protocol="fastdeploy"``): its signals and per-tensor IPC records.
FASTDEPLOY = FastDeployProtocol()
