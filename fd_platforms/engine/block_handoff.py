"""Handing the agreed block count to FastDeploy's engine, in its own format.

FastDeploy's engine creates ``get_profile_block_num.<suffix>`` (int32, one word), polls it while it
is 0, and only then sizes its block tables and starts the cache service. After profiling and the
agreement across ranks, local rank 0 writes the count there; :func:`hand_off_block_count` is that
write, checked first (FastDeploy's word holds an int32).
"""

from __future__ import annotations

from ..contract.integers import INT32_MAX, check_int
from ..ipc.fastdeploy_signals import PROFILE_BLOCK_NUM, FastDeploySignal, check_suffix


def hand_off_block_count(suffix: str | int, num_blocks: int) -> None:
    """Write ``num_blocks`` into FastDeploy's ``get_profile_block_num.<suffix>`` (call it on local rank 0).

    A ConfigError for a count FastDeploy's int32 word cannot hold (or one below 1, which its engine
    would keep waiting on); a :class:`~fd_platforms.contract.errors.CacheSignalError` when the
    engine has not created the signal.
    """
    suffix = check_suffix(suffix)
    check_int("num_blocks", num_blocks, 1, INT32_MAX, note="FastDeploy's get_profile_block_num is int32",
              fix="pass the agreed number of device blocks; its engine waits while the word is 0")  # fmt: skip
    with FastDeploySignal.attach(PROFILE_BLOCK_NUM, suffix) as word:
        word.set(0, num_blocks)
