"""The worker process of one local rank: plan, decide, then create the KV cache or wait for it.

Messages with the engine, in order: send ``("plan", (plan, seconds))``; receive ``("final", plan)``
(the minimum across ranks); send ``("decision", decision)``; a non-creator receives
``("manager", pid)`` and waits for its slot; send ``("ready", WorkerResult)``; hold the cache until
``("stop", None)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from ..cache_signal import CacheReadySignal
from ..platform import Platform
from ..sizes import format_size
from ..types import DeviceMemory
from .child import child_platform, expect, load_paddle, run_child
from .progress import Progress
from .report import Allocation
from .spec import RunSpec


@dataclass(frozen=True)
class WorkerResult:
    """A ready rank: what it allocated itself (creators), or how long it waited (the others)."""

    allocation: Allocation | None
    wait_seconds: float | None


def worker_main(spec: RunSpec, rank: int, signal_name: str, conn: Connection) -> None:
    """Process target of rank ``rank``'s worker."""
    run_child(f"rank {rank}", conn, spec.quiet, _work, spec, rank, signal_name)


def rank_memory(spec: RunSpec, platform: Platform, rank: int) -> DeviceMemory:
    """The memory ``rank`` plans on: ``--device-memory``, its device's live facts, or on cpu
    (one host shared by every rank) an even share of the host's live facts."""
    if spec.device_memory is not None:
        return DeviceMemory(spec.device_memory, None, None, "--device-memory")
    live = platform.device_memory(spec.device_id(rank))
    if not spec.shares_device or spec.ranks == 1:
        return live
    share = spec.ranks
    return DeviceMemory(
        total_bytes=live.total_bytes // share,
        free_bytes=None if live.free_bytes is None else live.free_bytes // share,
        process_bytes=live.process_bytes,
        source=f"{live.source}, split evenly across {share} ranks sharing host memory",
    )


def _work(conn: Connection, say: Progress, spec: RunSpec, rank: int, signal_name: str) -> None:
    platform = child_platform(spec)
    started = time.monotonic()
    layout = spec.layout(rank)
    cache_config = spec.deploy.cache
    plan = platform.max_num_blocks(
        layout=layout,
        cache=cache_config,
        memory=rank_memory(spec, platform, rank),
        non_cache_bytes=spec.non_cache,
        host_memory=spec.host_memory,
    )
    conn.send(("plan", (plan, time.monotonic() - started)))
    say(f"planned {plan.num_blocks} blocks of {format_size(plan.bytes_per_block)} ({plan.binding_reason})")
    final = expect(conn, "final", spec.timeout)
    decision = platform.should_create_cache_tensor(
        profile=spec.profile,
        num_cpu_blocks=final.num_cpu_blocks,
        storage_backend=cache_config.kvcache_storage_backend,
        splitwise_role=spec.deploy.scheduler.splitwise_role,
    )
    conn.send(("decision", decision))
    if not decision.create:
        manager_pid = expect(conn, "manager", spec.timeout)
        say(f"waiting for the cache manager (pid {manager_pid}) to allocate this rank's cache")
        waited = platform.wait_cache_ready(signal_name, rank, timeout=spec.timeout, setter_pid=manager_pid)
        say(f"cache ready after waiting {waited:.2f} s")
        conn.send(("ready", WorkerResult(None, waited)))
        expect(conn, "stop", spec.hold_timeout)
        return
    load_paddle()
    size = format_size(final.num_blocks * final.bytes_per_block)
    say(f"allocating {size} of KV cache ({decision.deciding_term}: {decision.reason})")
    started = time.monotonic()
    cache = platform.allocate_kv_cache(layout, final.num_blocks, progress=say.allocation(f"allocating {size}"))
    try:
        seconds = time.monotonic() - started
        with CacheReadySignal.attach(signal_name) as signal:
            signal.set(rank)
        allocation = Allocation(rank, cache.device, cache.nbytes, 0, None, None, seconds)
        conn.send(("ready", WorkerResult(allocation, None)))
        expect(conn, "stop", spec.hold_timeout)
    finally:
        cache.release()
