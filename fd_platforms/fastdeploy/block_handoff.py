"""Handing the agreed block count to FastDeploy's engine, in its own format.

FastDeploy's engine creates ``get_profile_block_num`` (``fastdeploy/engine/engine.py``,
``LLMEngine._init_worker_signals``; ``engine/common_engine.py`` alike), polls word 0 while it is 0
(``_stop_profile``), and only then sizes its block tables and starts the cache service. After
profiling and the agreement across ranks, local rank 0 writes the count there;
:func:`hand_off_block_count` is that write, checked first (FastDeploy's words are int32).

**Its own suffix.** The engine names this signal with ``engine_worker_queue_port[0]`` and hands that
value to its workers as ``--engine_pid`` (``_start_worker_service``); a worker writes
``get_profile_block_num.<parallel_config.engine_pid>`` (``fastdeploy/worker/worker_process.py``,
``PaddleDisWorkerProc.initialize_kv_cache``). ``cache_ready_signal`` and the other cache words carry
the data-parallel rank's ``local_engine_worker_queue_port`` instead (``common_engine.py``,
``_init_worker_monitor_signals``): with data parallelism the two differ, so the hand-off takes its
own ``block_count_suffix`` (default: the signal suffix, the same with one data-parallel rank).

**Its length.** One word, except where Paddle is built with the ``iluvatar_gpu`` custom device: there
the engine makes one word per local rank (``worker_num_per_node``), and FastDeploy's Iluvatar worker
(``fastdeploy/worker/iluvatar_worker.py``, ``IluvatarPaddleDisWorkerProc.initialize_kv_cache``) has
each rank write its own count into its word, wait until every word is set, then write the minimum
back into its word: every word ends holding the agreed count. Our ranks agree before the hand-off,
so local rank 0 writes that end state directly — the count into every word, word 0 (the one the
engine reads) last. Which device types do this is :data:`PER_RANK_DEVICE_TYPES`, the one place.
"""

from __future__ import annotations

from ..contract.errors import CacheSignalError, ConfigError
from ..contract.integers import INT32_MAX, check_int
from ..ipc.shared_words import MAX_LOCAL_RANKS
from ..loading.platform import Platform
from .signals import PROFILE_BLOCK_NUM, FastDeploySignal, check_suffix, segment_name

#: Paddle device types whose FastDeploy engine makes ``get_profile_block_num`` one word per local rank
#: (its ``paddle.is_compiled_with_custom_device("iluvatar_gpu")`` in ``_init_worker_signals``).
PER_RANK_DEVICE_TYPES = frozenset({"iluvatar_gpu"})


def block_count_words(device_type: str, ranks: int) -> int:
    """How many words FastDeploy's engine gives ``get_profile_block_num`` for ``ranks`` local ranks of
    ``device_type``: one per rank on :data:`PER_RANK_DEVICE_TYPES`, else one."""
    return ranks if device_type in PER_RANK_DEVICE_TYPES else 1


def hand_off_block_count(
    instance: str | int,
    num_blocks: int,
    *,
    block_count_suffix: str | int | None = None,
    platform: Platform | None = None,
    ranks: int = 1,
) -> str:
    """Write ``num_blocks`` into FastDeploy's ``get_profile_block_num.<block_count_suffix>`` (call it on
    local rank 0); the segment's name.

    ``instance`` is the engine instance, FastDeploy's signal suffix (its ``engine_worker_queue_port``);
    ``block_count_suffix`` the block count's own (its worker's ``parallel_config.engine_pid``), default ``instance``.
    ``platform`` (default: one word, as on every platform but Iluvatar) and ``ranks``, the local
    ranks, give the words FastDeploy's engine makes (:func:`~fd_platforms.fastdeploy.block_handoff.block_count_words`).

    A ConfigError for a count FastDeploy's int32 word cannot hold (or one below 1, which its engine
    would keep waiting on), a bad suffix, platform or ``ranks``; a
    :class:`~fd_platforms.contract.errors.CacheSignalError` when the engine has not created the
    signal, or made it another length than FastDeploy's engine makes for this platform and ``ranks``.
    """
    target = check_suffix(instance, "instance")
    if block_count_suffix is not None:
        target = check_suffix(block_count_suffix, "block_count_suffix")
    check_int(
        "num_blocks",
        num_blocks,
        1,
        INT32_MAX,
        note="FastDeploy's get_profile_block_num is int32",
        fix="pass the agreed number of device blocks; its engine waits while the word is 0",
    )
    if platform is not None and not isinstance(platform, Platform):
        raise ConfigError("platform", platform, "a Platform, or None", "pass fd_platforms.current_platform()")
    check_int("ranks", ranks, 1, MAX_LOCAL_RANKS, fix="pass the number of local ranks (tp on one node)")
    device_type = "" if platform is None else platform.identity.device_type
    expected = block_count_words(device_type, ranks)
    with FastDeploySignal.attach(PROFILE_BLOCK_NUM, target) as words:
        if words.length != expected:
            raise CacheSignalError(_length_mismatch(words, expected, platform, ranks))
        for index in reversed(range(words.length)):  # word 0, the one the engine reads, last
            words.set(index, num_blocks)
    return segment_name(PROFILE_BLOCK_NUM, target)


def _length_mismatch(words: FastDeploySignal, expected: int, platform: Platform | None, ranks: int) -> str:
    where = "no platform given" if platform is None else f"platform {platform.name}"
    return (
        f"FastDeploy signal {words.name!r} holds {words.length} words, but FastDeploy's engine makes {expected} "
        f"for {where} and {ranks} local rank(s): one word, or one per local rank where Paddle is built for "
        f"{', '.join(sorted(PER_RANK_DEVICE_TYPES))} (Iluvatar). Fix: pass platform= (the selected platform) and "
        "ranks= (the local ranks); check block_count_suffix names this engine's signal"
    )
