"""The engine's side of ``fd-platforms run``: select, create the signal, drive the children, report.

Phases, each bounded by the run's timeout: the workers' plans (the engine broadcasts the minimum
across ranks), their decisions, then the ``ready`` of every worker and of the cache manager it
starts when some rank does not create its cache (given one more margin, so a waiter that times
out reports it itself). Whatever happens, leaving :func:`run_lifecycle` stops every child and
removes the signal from ``/dev/shm``.
"""

from __future__ import annotations

import time

from ..cache_signal import CacheReadySignal, reclaim_stale_signals
from ..errors import ConfigError
from ..planner import check_host_swap, min_across_ranks
from ..platform import Platform
from ..selection import Prober, select_platform
from ..types import CacheDecision, Plan
from .children import Child, Children
from .manager import manager_main
from .progress import Progress
from .report import Allocation, RankReport, RunReport
from .spec import MARGIN_SECONDS, RunSpec
from .worker import WorkerResult, worker_main


def select_run_platform(ranks: int) -> Platform:
    """The selected platform, checked to have a device for each of ``ranks`` local ranks.

    On cpu every rank shares the host's memory, so any number of ranks fits.
    """
    prober = Prober()
    platform = select_platform(prober=prober).platform
    if platform.identity.device_type == "cpu":
        return platform
    detection = prober.probe(platform.name).detection
    count = 0 if detection is None else detection.device_count
    if ranks > count:
        visible = platform.identity.visible_devices_env
        raise ConfigError(
            "--ranks",
            ranks,
            f"at most {count}: platform {platform.name} sees {count} device(s) here and each rank uses its own",
            f"lower --ranks to {count} or less" + (f", or make more devices visible ({visible})" if visible else ""),
        )
    return platform


def run_lifecycle(spec: RunSpec, say: Progress) -> RunReport:
    """Run the lifecycle once; raises :class:`~fd_platforms.errors.RunError` when a process fails."""
    started = time.monotonic()
    reclaim_stale_signals()  # what engines killed with SIGKILL left behind (each warned about)
    with CacheReadySignal.create(spec.ranks) as signal, Children() as children:
        workers = [children.start(f"rank {rank}", worker_main, spec, rank, signal.name) for rank in range(spec.ranks)]
        pids = ", ".join(str(worker.pid) for worker in workers)
        say(f"platform {spec.platform}: started {spec.ranks} worker(s) (pid {pids}), cache-ready signal {signal.name}")
        planned = children.collect(workers, "plan", spec.timeout)
        final = min_across_ranks([planned[worker][0] for worker in workers])
        check_host_swap(final, spec.deploy.cache, host_bytes=spec.host_memory, ranks=spec.ranks)
        say(f"every rank planned; each uses {final.num_blocks} blocks (the minimum across ranks)")
        children.send(workers, "final", final)
        decisions: dict[Child, CacheDecision] = children.collect(workers, "decision", spec.timeout)
        attaching = tuple(rank for rank, worker in enumerate(workers) if not decisions[worker].create)
        manager = None
        if attaching:
            manager = children.start("cache manager", manager_main, spec, attaching, final, signal.name)
            say(f"starting the cache manager (pid {manager.pid}) for rank(s) {', '.join(map(str, attaching))}")
            children.send([workers[rank] for rank in attaching], "manager", manager.pid)
        expected = workers if manager is None else [manager, *workers]  # a failing manager is named first
        ready = children.collect(expected, "ready", spec.timeout + MARGIN_SECONDS)
        say("every rank's KV cache is ready; stopping")
    managed: dict[int, Allocation] = {} if manager is None else {a.rank: a for a in ready[manager]}
    ranks = tuple(
        _rank_report(rank, final, planned[worker], decisions[worker], ready[worker], managed)
        for rank, worker in enumerate(workers)
    )
    return RunReport(
        platform=spec.platform,
        model=spec.deploy.model.name,
        signal=signal.name,
        splitwise_role=spec.deploy.scheduler.splitwise_role,
        storage_backend=spec.deploy.cache.kvcache_storage_backend,
        profile=spec.profile,
        bytes_per_block=final.bytes_per_block,
        manager_pid=None if manager is None else manager.pid,
        wall_seconds=time.monotonic() - started,
        ranks=ranks,
    )


def _rank_report(
    rank: int,
    final: Plan,
    planned: tuple[Plan, float],
    decision: CacheDecision,
    result: WorkerResult,
    managed: dict[int, Allocation],
) -> RankReport:
    allocation = result.allocation if result.allocation is not None else managed[rank]
    return RankReport(
        rank=rank,
        device=allocation.device,
        create=decision.create,
        deciding_term=decision.deciding_term,
        allocated_by="worker" if result.allocation is not None else "cache manager",
        planned_blocks=planned[0].num_blocks,
        num_blocks=final.num_blocks,
        num_cpu_blocks=final.num_cpu_blocks,
        device_bytes=allocation.device_bytes,
        host_bytes=allocation.host_bytes,
        pinned=allocation.pinned,
        host_kind=allocation.host_kind,
        plan_seconds=planned[1],
        allocate_seconds=allocation.seconds,
        wait_seconds=result.wait_seconds,
    )
