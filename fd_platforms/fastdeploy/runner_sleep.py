"""Our runner's side of FastDeploy's ``/v1/sleep`` and ``/v1/wakeup``: :class:`SleepingKVCache`.

FastDeploy's worker answers a sleep or wakeup ``ControlRequest`` by calling its worker's method of that name with
the request's args (``worker_process.py`` L730-754), which calls its model runner's (``gpu_worker.py`` L195-201):
``GPUModelRunner.sleep(tags)`` lets go of the KV cache (``clear_cache``) for the ``kv_cache`` tag and
``wakeup(tags)`` initializes it again (``initialize_kv_cache``), each a no-op where already done
(``gpu_model_runner.py`` L3118-3177). A port gives those methods' KV-cache part to this object; the ``weight`` tag
stays the runner's own.
"""

from __future__ import annotations

from ..contract.errors import ConfigError
from ..engine.initialize import initialize_kv_cache
from ..engine.kv_cache import KVCache
from ..engine.request import CacheRequest
from ..loading.platform import Platform

KV_CACHE_TAG = "kv_cache"
TAGS = ("weight", "kv_cache")  # common_engine.py _parse_tags (L1668-1687)


class SleepingKVCache:
    """One rank's KV cache that sleeps (:meth:`KVCache.clear() <fd_platforms.engine.kv_cache.KVCache.clear>`) and wakes
    up (:func:`~fd_platforms.engine.initialize.initialize_kv_cache` with ``request`` again) on FastDeploy's tags."""

    def __init__(self, platform: Platform, request: CacheRequest, cache: KVCache) -> None:
        self.platform, self.request = platform, request
        self.cache: KVCache | None = cache

    @property
    def sleeping(self) -> bool:
        return self.cache is None

    def sleep(self, tags: str) -> None:
        """FastDeploy's ``sleep(tags)`` for the KV cache: let go of it (a no-op while asleep)."""
        if KV_CACHE_TAG in _tags(tags) and self.cache is not None:
            self.cache.clear()
            self.cache = None

    def wakeup(self, tags: str) -> None:
        """FastDeploy's ``wakeup(tags)`` for the KV cache: create or attach it again (a no-op while awake)."""
        if KV_CACHE_TAG in _tags(tags) and self.cache is None:
            self.cache = initialize_kv_cache(self.platform, self.request)


def _tags(tags: object) -> list[str]:
    """FastDeploy's comma-separated tags (its engine has checked them: L1683-1685), checked again."""
    named = tags.split(",") if isinstance(tags, str) else None
    if named is None or not set(named) <= set(TAGS):
        raise ConfigError("tags", tags, f"comma-separated names from {', '.join(TAGS)}", "send FastDeploy's tags")
    return named
