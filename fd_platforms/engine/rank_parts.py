"""Which parts of a rank's KV cache this process has created: the rank's one slot is set once every part is.

FastDeploy keeps one slot per rank (its ``cache_ready_signal`` word), while its worker creates a rank's cache in two
calls: the MTP proposer its draft layers (``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``,
``set_data_ipc`` and no slot) and the runner its main layers (``fastdeploy/worker/gpu_model_runner.py``
``initialize_kv_cache``, which sets the slot; ``update_share_input_block_num`` calls the proposer first). An
attacher (the cache transfer manager, ``cache_transfer_manager.py`` ``_init_gpu_cache``) opens main and draft
layers alike once the slot is set. So the slot means "every part is published": a creator of ours sets it
when the call that completes the rank in this process returns, in whichever order the runner and the proposer
call. Both parts of a rank are created in one process (the worker), so the record is this process's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..ipc.shm import shm_path

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..rules.layout import CacheLayout
    from .protocols import WireProtocol

#: The parts a rank's cache is complete with, for each part a layout can be (rules.layout.Part).
_COMPLETE = {"all": frozenset({"all"}), "main": frozenset({"main", "draft"}), "draft": frozenset({"main", "draft"})}
#: How to publish a part a creator left out.
_MAKE_PART = {
    "draft": "have the creating worker's MTP proposer create the draft layers too (initialize_kv_cache with "
    "whole.draft() and the same num_blocks), or, without MTP, pass the manager no draft=",
    "main": "have the creating worker's runner create the main layers too (initialize_kv_cache with whole.main() and "
    "the same num_blocks)",
}
_lock = threading.Lock()
_created: dict[tuple[str, str, int], set[str]] = {}


def created(protocol: str, instance: str, rank: int, part: str) -> bool:
    """Record that this process created and published ``part`` of ``rank``'s cache; whether the rank is now
    complete (its slot may be set)."""
    with _lock:
        parts = _created.setdefault((protocol, instance, rank), set())
        parts.add(part)
        return parts >= _COMPLETE[part]


def cleared(protocol: str, instance: str, rank: int, part: str) -> None:
    """Record that this process let go of ``part`` of ``rank``'s cache (cleared, or its creation withdrawn)."""
    with _lock:
        parts = _created.get((protocol, instance, rank))
        if parts is not None:
            parts.discard(part)
            if not parts:
                del _created[(protocol, instance, rank)]


def one_missing(wire: WireProtocol, instance: str, rank: int, parts: Sequence[CacheLayout | None]) -> str:
    """For an attacher's timed-out wait on the rank's slot, where ``parts`` are main and draft and the creator
    published one without the other (its record is there, the other's not): which, and the fix; "" otherwise."""
    records = {layout.part: wire.part_record(instance, layout) for layout in parts if layout is not None}
    published = {part: os.path.exists(shm_path(record)) for part, record in records.items()}
    if len(published) != 2 or len(set(published.values())) != 2:
        return ""
    there, missing = sorted(published, key=lambda part: not published[part])
    return (
        f"Rank {rank}'s creator published its {there} part (/dev/shm/{records[there]}) but not its {missing} part "
        f"(no /dev/shm/{records[missing]}), and sets the rank's slot only once both are. Fix: {_MAKE_PART[missing]}"
    )
