"""fd-platforms' own protocol (the default): one cache-ready signal and one manifest per rank.

=================== =====================================================================
step                speaks
=================== =====================================================================
``instance=``       our cache-ready signal, ``fd_cache_ready.<id>``
cache ready         its slot: a futex word, the creator's liveness by ``flock``
                    (:class:`~fd_platforms.ipc.cache_signal.CacheReadySignal`)
tensors published   one JSON manifest per rank, tensors named ``fd_kv.<id>.<name>``
                    (:mod:`fd_platforms.engine.publication`)
attacher lets go    drops its lock on the manifest (and resets its slot)
=================== =====================================================================

The cache manager says nothing beyond the slot, and nothing waits for a block count.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

from ...contract.errors import ConfigError
from ...ipc.cache_signal import CacheReadySignal, check_signal_name, resolve_timeout
from ...rules.decision import DEFAULT_RULE, DecisionInputs, check_pin
from ..publication import Publication, PublishedTensor, publication_name, published_tensor_name, reclaim_instance
from .interface import WireProtocol

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...loading.platform import Platform
    from ...rules.layout import CacheLayout


class FdPlatformsProtocol(WireProtocol):
    """Our signal and manifests; see the module docstring."""

    name = "fd-platforms"

    def check_instance(self, instance: object) -> None:
        check_signal_name(instance, "instance")

    def instance_name(self, instance: object, *, tp: int | None) -> str:
        """Our engine instance is named by its cache-ready signal (``fd_cache_ready.<id>``); ``tp`` changes nothing."""
        if instance is None:
            raise ConfigError(
                "instance",
                None,
                "the engine instance's cache-ready signal (fd_cache_ready.<id>)",
                "pass instance=, the name of the signal the engine created",
            )
        return check_signal_name(instance, "instance")

    def tensor_name(self, instance: str, layout_name: str) -> str:
        return published_tensor_name(instance, layout_name)

    def set_ready(self, instance: str, rank: int) -> None:
        with CacheReadySignal.attach(instance) as signal:
            signal.set(rank)

    def clear_ready(self, instance: str, rank: int) -> None:
        with CacheReadySignal.attach(instance) as signal:
            signal.clear(rank)

    def check_signals(self, instance: str, rank: int, *, manager: bool, swap: bool) -> None:
        """The cache-ready signal with ``rank``'s slot: the one signal either side writes."""
        with CacheReadySignal.attach(instance) as signal:
            signal.is_set(rank)

    def check_export(self, platform: Platform, device: str) -> None:
        """Nothing: our manifest carries whatever handle the platform's export gives (Paddle's VMM V1 metadata
        included), and the export itself refuses memory its IPC cannot share (VMM V2, see
        :mod:`fd_platforms.kit.allocator_flags`) before anything is allocated."""

    def rule_in_force(self, rule: str | None, inputs: DecisionInputs, field: str = "rule") -> str:
        """The pinned version, else the default: every process of ours is given the engine's rule."""
        check_pin(rule, field)
        return rule or DEFAULT_RULE

    def rule_mismatch(self, rule: str, inputs: DecisionInputs) -> str:
        return ""

    def wait_limit(self, timeout: float | None) -> float:
        """``timeout``, else ``FD_CACHE_READY_TIMEOUT``, else 600 s."""
        return resolve_timeout(timeout)

    def wait_ready(
        self, platform: Platform, instance: str, rank: int, timeout: float | None, creator_pid: int | None
    ) -> float:
        return platform.wait_cache_ready(instance, rank, timeout=timeout, creator_pid=creator_pid)

    def part_record(self, instance: str, layout: CacheLayout) -> str:
        """The part's manifest."""
        return publication_name(instance, layout.rank, layout.part)

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
    ) -> Publication:
        """Every attacher holds the manifest's lock while attached, so a clear waits for whoever does."""
        return Publication.create(publication_name(instance, rank, part), rank, device, list(tensors))

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
    ) -> Publication:
        return Publication.open(publication_name(instance, rank, part), rank)  # the manifest carries the shapes

    def manager_up(self, instance: str, rank: int, *, swap: bool) -> None:
        """Nothing: the slot is the whole word."""

    def manager_swap_freed(self, instance: str, rank: int) -> None:
        """Nothing: no process watches our swap space."""

    def hand_off_block_count(
        self, instance: str, num_blocks: int, *, block_count_suffix: str | None, platform: Platform, ranks: int
    ) -> None:
        """Nothing: our engine hands the count to its processes itself."""

    def create_signals(self, ranks: int, *, device_type: str, block_count_suffix: str | None) -> tuple[str, ExitStack]:
        """Our one signal (no block-count word: ``device_type`` and ``block_count_suffix`` change nothing)."""
        held = ExitStack()
        signal = held.enter_context(CacheReadySignal.create(ranks))
        return signal.name, held

    def ready_signal(self, instance: str) -> str:
        return instance

    def describe_signals(self, instance: str) -> str:
        return f"engine instance {instance} (its cache-ready signal)"

    def reclaim(self, instance: str) -> None:
        reclaim_instance(instance)


#: Our protocol (the cache-ready signal and our manifests), the one an engine speaks unless told otherwise.
OURS = FdPlatformsProtocol()
