"""FastDeploy's RL flow as its two events, followed by a runner of ours: ``model_weights_status``.

FastDeploy's engine clears and updates on two separate requests (``EngineClient.clear_load_weight`` and
``update_model_weight``, ``fastdeploy/entrypoints/engine_client.py``): the first writes
``model_weights_status`` CLEARING and waits for CLEARED there (and, with a cache transfer manager, for
``kv_cache_status`` CLEARED); the second writes UPDATING and waits for NORMAL in both. Its workers follow
the word in their event loop (``PaddleDisWorkerProc.event_loop_normal``, ``fastdeploy/worker/worker_process.py``;
``DynamicWeightManager.check_model_weights_status``, ``fastdeploy/rl/dynamic_weight_manager.py``): on CLEARING
each writes ``kv_cache_status`` CLEARING and clears its weights and cache, and local rank 0 writes CLEARED
(``_update_shared_status``); on UPDATING each writes ``kv_cache_status`` UPDATING and loads the weights and the
cache again, and local rank 0 writes NORMAL.

:func:`follow_model_weights_status` is that loop for a runner of ours that replaces FastDeploy's worker loop:
every rank runs its own (one process per rank, as FastDeploy), and rank 0 drives ``kv_cache_status`` with
:func:`~fd_platforms.fastdeploy.drive_kv_cache_clear` and :func:`~fd_platforms.fastdeploy.drive_kv_cache_restore`,
so its answer to the engine waits until every rank let go and the caches are freed, then created again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from ..contract.integers import check_int
from ..ipc.shared_words import MAX_LOCAL_RANKS
from ..loading.platform import Platform
from .cache_status import check_callable, checked_drive, drive_kv_cache_clear, drive_kv_cache_restore
from .signals import MODEL_WEIGHTS_STATUS, FastDeploySignal, KVCacheStatus

LOOK_SECONDS = 0.01  # how often the word is looked at (FastDeploy's worker: every 0.01 s)
CLEAR_SIDE = (KVCacheStatus.CLEARING, KVCacheStatus.CLEARED)


def follow_model_weights_status(
    instance: str | int,
    rank: int,
    *,
    clear: Callable[[], None],
    restore: Callable[[], None],
    until: Callable[[], bool],
    barrier: Callable[[], object] | None = None,
    timeout: float | None = None,
    creator_pid: int | None = None,
    platform: Platform | None = None,
    managers: str = "fastdeploy",
    tp: int | None = None,
) -> int:
    """Follow ``model_weights_status.<suffix>`` for local rank ``rank`` until ``until()`` is true; the
    rounds followed (restores done). See the module docstring.

    On CLEARING (or CLEARED, where this rank's look missed CLEARING) ``clear()`` runs once: drop the
    weights and let go of the KV cache (``KVCache.clear``); rank 0 then drives the cache's clear
    (:func:`~fd_platforms.fastdeploy.drive_kv_cache_clear`: every rank let go, the creator freed) and writes
    CLEARED. On UPDATING (or NORMAL, where a look missed UPDATING) after a clear, rank 0 drives the restore
    (:func:`~fd_platforms.fastdeploy.drive_kv_cache_restore`) and every rank runs ``restore()`` (load the
    weights, :func:`~fd_platforms.engine.initialize_kv_cache` again); rank 0 then writes NORMAL.

    ``barrier`` (every rank's, e.g. a tensor-parallel group's ``paddle.distributed.barrier``) is called by
    every rank after ``clear()`` and after ``restore()``, before rank 0 writes its word, as FastDeploy's
    ``clear_parameters`` and ``finalize_update`` meet: without it rank 0 may write NORMAL before a slower
    rank has seen UPDATING, and the engine's next CLEARING may come before that rank restored.

    ``timeout``, ``creator_pid``, ``platform``, ``managers`` and ``tp`` as
    :func:`~fd_platforms.fastdeploy.drive_kv_cache_update`'s (rank 0's drives); a word outside FastDeploy's
    values is logged and never acted on. A failed drive raises (a SignalWaitError, or a CacheUpdateError
    naming the rank the cache creator could not clear or create), leaving ``kv_cache_status`` NORMAL where
    every rank's cache is there, else a failure word (:mod:`~fd_platforms.fastdeploy.cache_status`), and
    ``model_weights_status`` as it was, which FastDeploy's engine times out on.
    """
    suffix = instance  # FastDeploy names its signals after the engine instance
    check_int("rank", rank, 0, MAX_LOCAL_RANKS - 1, what="a local rank", fix="pass this runner's local rank")
    meet = barrier if barrier is not None else (lambda: None)
    for name, function in (("clear", clear), ("restore", restore), ("until", until), ("barrier", meet)):
        check_callable(name, function, "pass a function of no arguments")
    limit = checked_drive(suffix, timeout, creator_pid, None, platform, managers, tp).limit  # rank 0's drives' checks
    clear_caches, restore_caches = (
        partial(half, suffix, timeout=limit, creator_pid=creator_pid, platform=platform, managers=managers, tp=tp)
        for half in (drive_kv_cache_clear, drive_kv_cache_restore)
    )
    rounds, cleared = 0, False
    with FastDeploySignal.attach(MODEL_WEIGHTS_STATUS, suffix) as weights:
        while not until():
            current = weights.checked(0)
            if not cleared and current in CLEAR_SIDE:
                clear()
                meet()
                cleared = True
                if rank == 0:
                    clear_caches()
                    weights.set(0, KVCacheStatus.CLEARED)
            elif cleared and current in (KVCacheStatus.UPDATING, KVCacheStatus.NORMAL):
                if rank == 0:
                    restore_caches()
                restore()
                meet()
                cleared, rounds = False, rounds + 1
                if rank == 0:
                    weights.set(0, KVCacheStatus.NORMAL)
            else:
                time.sleep(LOOK_SECONDS)
    return rounds
