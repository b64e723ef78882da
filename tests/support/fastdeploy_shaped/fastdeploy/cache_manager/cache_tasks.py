"""FastDeploy's storage tasks (``fastdeploy/cache_manager/cache_tasks.py`` L21-33): a class outside the control
protocol that its engine cache queue also carries."""

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class CacheTask:
    task_id: str
    keys: list[str]
    token_ids: list[int]
    gpu_block_ids: list[int]


@dataclass(frozen=True, kw_only=True)
class ReadStorageTask(CacheTask):
    start_read_block_idx: int
    timeout: float = 30.0
