"""Which parts of a rank's KV cache this process has created: the rank's one slot is set once every part is.

FastDeploy keeps one ``cache_ready_signal`` word per rank, while its worker creates a rank's cache in two
calls: the MTP proposer its draft layers (``fastdeploy/spec_decode/mtp.py`` ``MTPProposer.initialize_kv_cache``,
``set_data_ipc`` and no slot) and the runner its main layers (``fastdeploy/worker/gpu_model_runner.py``
``initialize_kv_cache``, which sets the slot; ``update_share_input_block_num`` calls the proposer first). An
attacher (the cache transfer manager, ``cache_transfer_manager.py`` ``_init_gpu_cache``) opens main and draft
layers alike once the word is set. So the word means "every part is published": a creator of ours sets it
when the call that completes the rank in this process returns, in whichever order the runner and the proposer
call. Both parts of a rank are created in one process (the worker), so the record is this process's.
"""

from __future__ import annotations

import threading

#: The parts a rank's cache is complete with, for each part a layout can be (rules.layout.Part).
_COMPLETE: dict[str, frozenset[str]] = {
    "all": frozenset({"all"}),
    "main": frozenset({"main", "draft"}),
    "draft": frozenset({"main", "draft"}),
}
_lock = threading.Lock()
_created: dict[tuple[str, str, int], set[str]] = {}


def created(protocol: str, signal_name: str, rank: int, part: str) -> bool:
    """Record that this process created and published ``part`` of ``rank``'s cache; whether the rank is now
    complete (its slot may be set)."""
    with _lock:
        parts = _created.setdefault((protocol, signal_name, rank), set())
        parts.add(part)
        return parts >= _COMPLETE[part]


def cleared(protocol: str, signal_name: str, rank: int, part: str) -> None:
    """Record that this process let go of ``part`` of ``rank``'s cache (cleared, or its creation withdrawn)."""
    with _lock:
        parts = _created.get((protocol, signal_name, rank))
        if parts is not None:
            parts.discard(part)
            if not parts:
                del _created[(protocol, signal_name, rank)]
