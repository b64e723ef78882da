"""Bodies of the processes the engine-API tests spawn: a cache manager and a creator that hold a cache."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection

from fd_platforms.engine import manage_kv_cache
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config
from fd_platforms.rules.layout import CacheLayout, build_layout

QWEN = os.path.join(os.path.dirname(__file__), "..", "examples", "qwen3-30b-a3b")


def qwen_layout(rank: int = 0, tp: int = 1, **cache: object) -> CacheLayout:
    return build_layout(load_model_config(QWEN), CacheConfig(**cache), ParallelConfig(tp, rank))  # type: ignore[arg-type]


def manage(signal_name: str, num_blocks: int, num_cpu_blocks: int, conn: Connection, cache: dict | None = None) -> None:
    """A cache manager for rank 0: publish, write 5.0 into the first key element, then serve
    ``read`` (the last value element), ``clear`` (with a timeout) and ``stop``."""
    import fd_platforms

    platform = fd_platforms.current_platform()
    managed = manage_kv_cache(
        platform, qwen_layout(**(cache or {})), num_blocks, num_cpu_blocks=num_cpu_blocks, signal_name=signal_name
    )
    managed.device.tensors[0][0, 0, 0, 0] = 5.0
    conn.send(("ready", os.getpid()))
    while True:
        kind, payload = conn.recv()
        if kind == "read":
            conn.send(managed.device.tensors[-1][-1, -1, -1, -1].item())
        elif kind == "clear":
            try:
                managed.clear(payload)
            except Exception as exc:  # reported to the test, which asserts on it
                conn.send((type(exc).__name__, str(exc), getattr(exc, "ranks", None)))
            else:
                conn.send(("cleared", None, None))
        elif kind == "stop":
            return


def export_and_hold(nbytes: int, conn: Connection) -> None:
    """Export one uint8 tensor of ``nbytes`` through the cpu platform, report its handle, then hold it."""
    import fd_platforms

    platform = fd_platforms.current_platform()
    shared = platform.export_cache_tensor("fd_kv.test-hold.blob", (nbytes,), "uint8", "cpu")
    shared.tensor[0] = 42
    conn.send(shared.handle)
    conn.recv()
