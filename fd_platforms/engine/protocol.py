"""Which inter-process protocol an engine speaks: ours (the default) or FastDeploy's own.

=================== ================================================ ==============================================
step                ``fd-platforms`` (default)                        ``fastdeploy``
=================== ================================================ ==============================================
``signal_name``     our cache-ready signal (``fd_cache_ready.<i>``)  FastDeploy's signal suffix (its engine port)
cache ready         our signal's slot (futex, flock liveness)        ``cache_ready_signal.<suffix>`` [tp] int32
tensors published   one JSON manifest per rank                       one ``set_data_ipc`` record per tensor
attacher lets go    drops its lock on the manifest                   resets its ``cache_ready_signal`` slot to 0
=================== ================================================ ==============================================

Every engine call takes ``protocol=`` and passes it here; nothing else in the engine branches on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from ..contract.errors import ConfigError
from ..ipc.cache_signal import CacheReadySignal, check_signal_name
from ..ipc.fastdeploy_signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    SWAP_SPACE_READY,
    FastDeploySignal,
    check_suffix,
)
from ..rules.config.settings import PROTOCOLS
from .fastdeploy_handles import FastDeployHandles
from .publication import Publication, PublishedTensor, publication_name, published_tensor_name

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..loading.platform import Platform

OURS, FASTDEPLOY = PROTOCOLS
Published = Union[Publication, FastDeployHandles]


def check_protocol(protocol: object, signal_name: object) -> str:
    """``protocol`` if it is one of :data:`PROTOCOLS` and ``signal_name`` fits it; a ConfigError otherwise."""
    if protocol not in PROTOCOLS:
        raise ConfigError(
            "protocol", protocol, f"one of {', '.join(PROTOCOLS)}",
            "pass protocol='fastdeploy' beside FastDeploy's own processes, else leave the default",
        )  # fmt: skip
    if protocol == FASTDEPLOY:
        check_suffix(signal_name)
    else:
        check_signal_name(signal_name)  # type: ignore[arg-type]
    return protocol  # type: ignore[return-value]


def tensor_name(protocol: str, signal_name: str, layout_name: str) -> str:
    """The name a tensor is exported and opened under: FastDeploy's is the layout's own name."""
    return layout_name if protocol == FASTDEPLOY else published_tensor_name(signal_name, layout_name)


def set_ready(protocol: str, signal_name: str, rank: int) -> None:
    """Set ``rank``'s cache-ready slot (and wake its waiters)."""
    _write_ready(protocol, signal_name, rank, 1)


def clear_ready(protocol: str, signal_name: str, rank: int) -> None:
    """Reset ``rank``'s cache-ready slot to 0 (under FastDeploy's protocol: the attacher's let-go)."""
    _write_ready(protocol, signal_name, rank, 0)


def _write_ready(protocol: str, signal_name: str, rank: int, value: int) -> None:
    if protocol == FASTDEPLOY:
        with FastDeploySignal.attach(CACHE_READY, signal_name) as fastdeploy:
            fastdeploy.set(rank, value)
        return
    with CacheReadySignal.attach(signal_name) as ours:
        if value:
            ours.set(rank)
        else:
            ours.clear(rank)


def manager_up(protocol: str, signal_name: str, rank: int, *, swap: bool) -> None:
    """The cache manager holds ``rank``'s caches: under FastDeploy's protocol it says so as its transfer
    manager does (``swap_space_ready_signal`` where it holds swap space, ``cache_transfer_inited_signal``),
    which FastDeploy's engine waits for before it starts its cache service. Ours needs no word."""
    if protocol != FASTDEPLOY:
        return
    if swap:
        with FastDeploySignal.attach(SWAP_SPACE_READY, signal_name) as swap_ready:
            swap_ready.set(rank, 1)
    with FastDeploySignal.attach(CACHE_TRANSFER_INITED, signal_name) as inited:
        inited.set(rank, 1)


def manager_swap_freed(protocol: str, signal_name: str, rank: int) -> None:
    """``rank``'s swap space was freed (FastDeploy's transfer manager resets its word then)."""
    if protocol == FASTDEPLOY:
        with FastDeploySignal.attach(SWAP_SPACE_READY, signal_name) as swap_ready:
            swap_ready.set(rank, 0)


def wait_ready(
    platform: Platform, protocol: str, signal_name: str, rank: int, timeout: float, setter_pid: int | None
) -> float:
    """Wait for ``rank``'s slot; the seconds waited. FastDeploy's slot is watched by the core itself
    (its writers wake nobody: see :mod:`fd_platforms.ipc.fastdeploy_signals`)."""
    if protocol != FASTDEPLOY:
        return platform.wait_cache_ready(signal_name, rank, timeout=timeout, setter_pid=setter_pid)
    with FastDeploySignal.attach(CACHE_READY, signal_name) as signal:
        return signal.wait_for(rank, 1, timeout, watch_pid=setter_pid, what=f"rank {rank} waiting for its KV cache")


def publish(
    protocol: str, signal_name: str, rank: int, device: str, tensors: Sequence[PublishedTensor], platform: str
) -> Published:
    """Publish ``rank``'s exported tensors (held by this process until retracted)."""
    if protocol == FASTDEPLOY:
        return FastDeployHandles.create(signal_name, rank, tensors, platform)
    return Publication.create(publication_name(signal_name, rank), rank, device, list(tensors))


def open_published(protocol: str, signal_name: str, rank: int, expected: Sequence[PublishedTensor]) -> Published:
    """``rank``'s publication, held by this attacher until it lets go; FastDeploy's records carry no
    shapes, so ``expected`` (this process's layout, no handles) supplies them."""
    if protocol == FASTDEPLOY:
        return FastDeployHandles.open(signal_name, rank, expected)
    return Publication.open(publication_name(signal_name, rank), rank)
