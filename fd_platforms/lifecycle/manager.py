"""The cache-manager process: allocates the KV cache (and host swap space) of the ranks that do not.

For each rank it serves, in order: the device cache with the rank's layout on the rank's device,
then, when the plan has ``num_cpu_blocks``, host swap space of ``num_cpu_blocks * bytes_per_block``
through ``host_alloc`` (pinned where the platform can); then it sets the rank's slot. It sends
``("ready", allocations)`` and holds everything until ``("stop", None)``.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection

from ..cache_signal import CacheReadySignal
from ..kv_cache import KVCache
from ..sizes import format_size
from ..types import HostBuffer, Plan
from .child import child_platform, expect, load_paddle, run_child
from .progress import Progress
from .report import Allocation
from .spec import RunSpec


def manager_main(spec: RunSpec, ranks: tuple[int, ...], plan: Plan, signal_name: str, conn: Connection) -> None:
    """Process target of the cache manager serving ``ranks``."""
    run_child(f"cache manager (pid {os.getpid()})", conn, spec.quiet, _manage, spec, ranks, plan, signal_name)


def _manage(
    conn: Connection, say: Progress, spec: RunSpec, ranks: tuple[int, ...], plan: Plan, signal_name: str
) -> None:
    load_paddle()
    platform = child_platform(spec)
    held: list[KVCache | HostBuffer] = []
    try:
        allocations = []
        with CacheReadySignal.attach(signal_name) as signal:
            for rank in ranks:
                layout = spec.layout(rank)
                size = format_size(plan.num_blocks * plan.bytes_per_block)
                say(f"allocating {size} of KV cache for rank {rank}")
                started = time.monotonic()
                cache = platform.allocate_kv_cache(
                    layout, plan.num_blocks, progress=say.allocation(f"rank {rank}: allocating {size}")
                )
                held.append(cache)
                host = None
                if plan.num_cpu_blocks > 0:
                    swap = format_size(plan.num_cpu_blocks * plan.bytes_per_block)
                    say(f"allocating {swap} of host swap space ({plan.num_cpu_blocks} blocks) for rank {rank}")
                    host = platform.host_alloc(plan.num_cpu_blocks * plan.bytes_per_block)
                    held.append(host)
                seconds = time.monotonic() - started
                signal.set(rank)
                allocations.append(
                    Allocation(
                        rank=rank,
                        device=cache.device,
                        device_bytes=cache.nbytes,
                        host_bytes=0 if host is None else host.nbytes,
                        pinned=None if host is None else host.pinned,
                        host_kind=None if host is None else host.kind,
                        seconds=seconds,
                    )
                )
        conn.send(("ready", tuple(allocations)))
        expect(conn, "stop", spec.hold_timeout)
    finally:
        for item in reversed(held):
            item.release()
