"""The cache-manager process: one public call per rank it serves, then what the engine asks.

It starts beside the workers, imports paddle while they plan, and receives ``("final", (plan,
creators))`` (the minimum across ranks; ``creators`` None, or each rank's worker pid where the pinned
rule lets the workers create). For each rank :func:`~fd_platforms.engine.manage_kv_cache` exports
and publishes the device cache, carves the host swap space (``num_cpu_blocks`` blocks in the
layout's names, pinned where the platform can) and sets the slot; or, where the rule lets the
workers create, waits for the worker's cache, attaches to it and carves the host swap space. It
sends ``("ready", allocations)``, then serves until ``("stop", None)``: ``mark`` / ``check`` (a
creator writes its tokens, reads the attacher's back), ``verify`` (an attacher reads the creator's,
writes its own), ``clear`` (a creator waits for its attacher to let go, then frees; an attacher
lets go) and ``init`` (take every rank again).
"""

from __future__ import annotations

import contextlib
import os
import time
from multiprocessing.connection import Connection

from ..contract.errors import FdPlatformsError
from ..contract.paddle_import import import_paddle
from ..engine import HostCache, ManagedCache, manage_kv_cache
from ..fastdeploy import FASTDEPLOY  # noqa: F401 - registers protocol "fastdeploy", which [scheduler] protocol may name
from ..kit.host_memory import resident_bytes
from ..rules.sizes import format_size
from .child import child_platform, expect, run_child, serve
from .progress import Progress
from .report import Allocation
from .spec import RunSpec
from .tokens import read_tokens, verify_attached, write_tokens


def manager_main(spec: RunSpec, ranks: tuple[int, ...], instance: str, conn: Connection) -> None:
    """Process target of the cache manager serving ``ranks``."""
    run_child(f"cache manager (pid {os.getpid()})", conn, spec, _manage, spec, ranks, instance)


def _manage(conn: Connection, say: Progress, spec: RunSpec, ranks: tuple[int, ...], instance: str) -> None:
    import_paddle()  # while the workers plan
    platform = child_platform(spec)
    plan, creators = expect(conn, "final", spec.timeout)  # creators: each rank's worker pid where they create
    held: dict[int, ManagedCache] = {}
    kept: dict[int, HostCache] = {}  # host swap caches a clear kept (FD_ENABLE_SWAP_SPACE_CLEARING unset), reused

    def take_all(_: object = None) -> tuple[Allocation, ...]:
        """Each rank's cache: published here (``creators`` None), or attached to its worker's (the pid
        of each rank's creating worker given); with its host swap cache either way, the one a clear kept
        where there is one (``held``, filled here, and ``kept``, taken from)."""
        allocations = []
        for rank in ranks:
            size = format_size(spec.layout(rank).device_bytes(plan.num_blocks))
            swap_bytes = format_size(plan.num_cpu_blocks * plan.bytes_per_block)
            swap = f"{swap_bytes} of host swap space ({plan.num_cpu_blocks} blocks)"
            started = time.monotonic()
            host_cache = kept.pop(rank, None)
            verb = "allocating" if host_cache is None else "reusing the kept"  # kept across the clear
            if creators is None:
                say(
                    f"publishing {size} of KV cache"
                    + (f" and {verb} {swap}" if plan.num_cpu_blocks else "")
                    + f" for rank {rank}"
                )
            else:
                kept_note = "" if host_cache is None else " (kept across the clear)"
                say(f"attaching to rank {rank}'s KV cache (worker pid {creators[rank]}) to hold {swap}{kept_note}")
            request = spec.cache_request(
                rank, plan, instance, host_cache=host_cache, creator_pid=None if creators is None else creators[rank]
            )
            # it creates or attaches as the rule decides, as the engine did to pass creators
            cache = manage_kv_cache(platform, request, progress=say.allocation(f"rank {rank}: publishing {size}"))
            seconds = time.monotonic() - started
            held[rank] = cache
            host = cache.host_cache
            allocations.append(
                Allocation(
                    rank=rank,
                    device=cache.kv_cache.device,
                    device_bytes=cache.kv_cache.nbytes,
                    host_bytes=0 if host is None else host.nbytes,
                    pinned=None if host is None else host.pinned,
                    host_kind=None if host is None else host.buffer.kind,
                    seconds=seconds,
                    attached_tensors=0 if cache.created else len(cache.kv_cache.tensors),
                    attach_seconds=cache.kv_cache.attach_seconds,
                )
            )
        return tuple(allocations)

    try:
        conn.send(("ready", take_all()))

        def clear(_: object) -> None:
            for rank in list(held):
                held[rank].clear(spec.timeout)
                host = held.pop(rank).host_cache
                if host is not None:
                    kept[rank] = host

        def mark(token: int) -> None:
            for cache in held.values():
                write_tokens(cache.kv_cache.tensors, token, last=False)

        serve(
            conn,
            spec.hold_timeout,
            {
                "mark": mark,
                "check": lambda token: {
                    rank: read_tokens(cache.kv_cache.tensors, token, last=True) for rank, cache in held.items()
                },
                "verify": lambda tokens: {
                    rank: verify_attached(cache.kv_cache.tensors, *tokens) for rank, cache in held.items()
                },
                "clear": clear,
                "init": take_all,
                "rss": lambda _: resident_bytes(),
            },
        )
    except BaseException:  # the real cause goes on at once: attachers may hold what was published, never wait
        for cache in held.values():
            with contextlib.suppress(FdPlatformsError):
                cache.clear(0.001, clear_host=True)
        raise
    for cache in held.values():
        cache.clear(spec.timeout, clear_host=True)
