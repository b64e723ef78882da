"""A cache's timings (``KVCache.attach_seconds``, ``wait_seconds``) are the attach and the wait alone: importing
Paddle, about a second cold, is reported apart (``import_seconds``)."""

from __future__ import annotations

import os
import time

import pytest
from kv_requests import kv_request
from run_helpers import QWEN, ROOT

import fd_platforms.engine.initialize as initialize
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import build_layout

DECODE = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "decode"}


@pytest.mark.slow  # it waits out a slow import, twice
def test_importing_paddle_is_timed_apart_from_the_attach(cpu: Platform, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = build_layout(load_model_config(ROOT / QWEN), CacheConfig(), ParallelConfig())
    real = initialize.import_paddle

    def slow_import():  # a cold `import paddle` takes about a second
        time.sleep(1.0)
        return real()

    monkeypatch.setattr(initialize, "import_paddle", slow_import)
    with CacheReadySignal.create(num_ranks=1) as signal:
        managed = manage_kv_cache(cpu, kv_request(layout, 1, num_cpu_blocks=0, instance=signal.name))
        try:
            cache = initialize_kv_cache(
                cpu, kv_request(layout, 1, instance=signal.name, creator_pid=os.getpid(), **DECODE)
            )
            assert managed.kv_cache.import_seconds is not None and managed.kv_cache.import_seconds >= 1.0
            assert cache.import_seconds is not None and cache.import_seconds >= 1.0
            assert cache.attach_seconds is not None and cache.attach_seconds < cache.import_seconds
            assert cache.wait_seconds is not None and cache.wait_seconds < cache.import_seconds
            cache.clear()
        finally:
            managed.clear(5)
