"""FastDeploy's ``CacheStatus`` (``fastdeploy/cache_manager/cache_data.py`` L24-35)."""

from enum import Enum


class CacheStatus(Enum):
    GPU = 0
    SWAP2CPU = 1
    SWAP2GPU = 2
    CPU = 3
    GPU2STORAGE = 4
    STORAGE2GPU = 5
    CTRL = -1
